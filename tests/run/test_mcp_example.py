"""The tool-use example through MCP (examples/tool_agent_mcp.yaml), short: the same SFT stage, then
RL on ToolUse-v0 whose calculator is the FastMCP server examples/mcp_calculator.py.

The bug story: a tool that works in an env's unit test but not in a training run — the server
started per process by the rollout worker, its calls inside the one token stream, its answers
masked out of the loss, no episode failed.
"""

from __future__ import annotations

from .test_examples import sft, text, train


def test_the_mcp_calculator_trains_like_the_python_one(tmp_path):
    model = sft("examples/tool_agent_sft.yaml", tmp_path / "sft")
    summary, sampled = train("examples/tool_agent_mcp.yaml", tmp_path / "run", f"model={model}", "eval.limit=16")
    assert "tool_use_rate_after" in summary
    called = [r for r in sampled if r["num_turns"] > 1]
    assert called, [r["num_turns"] for r in sampled]  # the model called the MCP calculator in some episodes
    for r in sampled:
        assert "<|tool|>" not in text(r, 1), text(r, 1)
    # the server's answers came back as masked tool turns of the one stream
    assert any("<|tool|>" in text(r, 0) for r in called)

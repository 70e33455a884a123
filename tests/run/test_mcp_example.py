"""The tool-use example through MCP (examples/tool_agent_mcp.yaml), short: the same SFT stage, then
RL on ToolUse-v0 whose calculator is the FastMCP server examples/mcp_calculator.py.

The bug story: a tool that works in an env's unit test but not in a training run — the server
started per process by the rollout worker, its calls inside the one token stream, its answers
masked out of the loss, no episode failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .test_examples import ROOT, sft, text


def test_the_mcp_calculator_trains_like_the_python_one(tmp_path):
    model = sft("examples/tool_agent_sft.yaml", tmp_path / "sft", "steps=10")  # the base model calls already
    run_dir = tmp_path / "run"  # two steps of 4 x 4 episodes, every one logged
    out = subprocess.run([str(Path(sys.executable).parent / "agentrl"), "train", "examples/tool_agent_mcp.yaml",
                          f"model={model}", f"run_dir={run_dir}", "steps=2", "rollout.batch_size=4",
                          "rollout.group_size=4", "eval.limit=8", "logging.trajectories_per_step=16",
                          "checkpoint.every_steps=0", "logging.tensorboard=false"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["counters"]["episodes_failed"] == 0, summary
    assert "tool_use_rate_after" in summary and summary["eval_after"] is not None
    sampled = [json.loads(line) for path in sorted((run_dir / "trajectories").glob("step_*.jsonl"))
               for line in path.read_text().splitlines()]
    assert len(sampled) == 32
    called = [r for r in sampled if r["num_turns"] > 1]
    assert called, [r["num_turns"] for r in sampled]  # the model called the MCP calculator in some episodes
    for r in sampled:
        assert "<|tool|>" not in text(r, 1), text(r, 1)
    # the server's answers came back as masked tool turns of the one stream
    assert any("<|tool|>" in text(r, 0) for r in called)

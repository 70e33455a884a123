"""Our env's tools served over MCP: the OpenAI Agents SDK's MCP client (``examples/mcp_agent.py``,
unmodified SDK, a subprocess) plays agentrl/ToolUse-v0 through ExternalAgentWorkflow's gateway,
against a real ``agentrl serve`` on the trained tiny model.

The bug stories: an external agent whose tool calls the env never sees (no credit for using a
tool's result), a tool endpoint any local process can call without the session's key, and an
agent's episode that is not recorded as the exact tokens sampled.
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

import httpx
import pytest

from agentrl.api import sampled_spans
from agentrl.client.remote_engine import RemoteEngine
from agentrl.model.arith_data import calculate
from agentrl.rollout.renderer import ChatRenderer
from envs.tool_use import make_task
from workflows.external_agent import ExternalAgentWorkflow

AGENT = [sys.executable, str(Path(__file__).resolve().parents[2] / "examples" / "mcp_agent.py")]


@pytest.fixture
async def engine(tiny_server):
    async with RemoteEngine(tiny_server.url) as e:
        yield e


async def test_the_agents_sdk_plays_our_env_over_mcp_recorded_and_rewarded(engine, tiny_model_dir):
    """Greedy on a calculator task: the SDK lists the env's calculator over MCP, the model calls
    it, the SDK runs it through the gateway's MCP endpoint (the env counts the call), the model
    answers, the agent steps the answer: one exact stream, rewarded by the env, which counts
    the MCP call as its own (``used_tool_result``: the answer is a result of this episode's calls)."""
    wf = ExternalAgentWorkflow(AGENT, tiny_model_dir, "agentrl/ToolUse-v0", {"kinds": ["calc"]}, context_length=1024,
                               timeout_s=120, extra_env={"AGENT_TEMPERATURE": "0", "AGENT_MAX_TOKENS": "100"})
    row = make_task(random.Random(7), "calc")
    try:
        [t] = await wf.arun_episode(engine, row)
    finally:
        await wf.aclose()
    text = ChatRenderer(tiny_model_dir).decode(t.input_ids)
    assert t.status.value == "ok", t.error
    call = re.search(r'<tool_call>(.*?)</tool_call><\|end\|><\|tool\|>(.*?)<\|end\|>', text)
    assert call, text  # the model called the tool; the SDK ran it over MCP and sent back its result
    expression = json.loads(call.group(1))["arguments"]["expression"]
    assert call.group(2) == calculate(expression)
    final = re.findall(r"\\boxed\{(-?\d+)\}", text)[-1]
    # the env graded the stepped answer, and credits a copied result of the MCP call as its own call's
    assert t.reward == t.metrics["reward/correct"] == float(final == row["answer"])
    assert t.metrics["reward/used_tool_result"] == float(final == call.group(2))
    assert len(sampled_spans(t.loss_mask)) == t.num_turns == 2 and t.metrics["segments_per_episode"] == 1.0


async def test_the_mcp_endpoint_takes_only_the_sessions_key(tiny_model_dir, tmp_path):
    """The in-process gateway has no admin key; its MCP endpoint still needs the session's."""
    from agentrl.process.services import background_server
    from agentrl.rollout.gateway import Gateway
    from agentrl.rollout.gateway_routes import build_app

    class Calculator:
        def schemas(self):
            return [{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
                "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"]}}}]

        async def call(self, name, arguments):
            return (str(arguments["a"] + arguments["b"]), True) if "b" in arguments else ("error: b is missing", False)

    gateway = Gateway(object(), tiny_model_dir)
    async with background_server(build_app(gateway)) as url:
        mine, other = gateway.open_session({}, tools=Calculator()), gateway.open_session({})
        endpoint = f"{url}/sessions/{mine.id}/mcp"
        request = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "add", "arguments": {"a": 2}}}
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        async with httpx.AsyncClient(timeout=30) as http:
            assert (await http.post(endpoint, json=request, headers=headers)).status_code == 401
            wrong = await http.post(endpoint, json=request, headers={**headers, "Authorization": f"Bearer {other.key}"})
            assert wrong.status_code == 401, wrong.text
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        client = create_mcp_http_client(headers={"Authorization": f"Bearer {mine.key}"})
        async with streamable_http_client(endpoint, http_client=client) as (read, write, _), \
                ClientSession(read, write) as mcp:
            await mcp.initialize()
            [listed] = (await mcp.list_tools()).tools
            assert listed.name == "add" and listed.inputSchema["required"] == ["a", "b"]
            ok = await mcp.call_tool("add", {"a": 2, "b": 40})
            bad = await mcp.call_tool("add", {"a": 2})
        assert (ok.isError, ok.content[0].text) == (False, "42")
        assert (bad.isError, bad.content[0].text) == (True, "error: b is missing")
        assert json.loads(json.dumps(gateway.stats))["sessions_opened"] == 2

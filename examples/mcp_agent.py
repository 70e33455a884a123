"""An external agent that plays our env's tools over MCP: the OpenAI Agents SDK, unmodified.

    ExternalAgentWorkflow("python examples/mcp_agent.py", model_dir, env_id="agentrl/ToolUse-v0")

It reads its task on stdin (``{"task", "messages", "tools"}``), connects the SDK's
``MCPServerStreamableHttp`` to ``AGENTRL_MCP_URL`` (the session's env tools, served by the
gateway; the session's key as bearer) and runs ``Runner.run`` with a chat-completions model
at ``OPENAI_BASE_URL`` (the same session): the SDK lists the tools, the model calls them, the
SDK runs each over MCP. The final answer is then submitted with ``POST
$AGENTRL_SESSION_URL/step`` (the session's last call), which grades it and records the
reward. Nothing here imports agentrl. ``AGENT_MAX_TOKENS`` (default 96), ``AGENT_TEMPERATURE``
(default 1.0) and ``AGENT_MAX_TURNS`` (default 4) set its sampling and its model calls.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import httpx
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded
from agents.mcp import MCPServerStreamableHttp
from openai import AsyncOpenAI


async def main() -> int:
    task = json.load(sys.stdin)
    key, session_url = os.environ["OPENAI_API_KEY"], os.environ["AGENTRL_SESSION_URL"]
    set_tracing_disabled(True)  # nothing leaves this machine
    client = AsyncOpenAI(max_retries=0)
    tools = MCPServerStreamableHttp({"url": os.environ["AGENTRL_MCP_URL"], "headers": {"Authorization": f"Bearer {key}"},
                                     "timeout": 30}, name="env", cache_tools_list=True)
    async with tools:
        agent = Agent(name="player", mcp_servers=[tools],
                      model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
                      model_settings=ModelSettings(temperature=float(os.environ.get("AGENT_TEMPERATURE", "1.0")),
                                                   max_tokens=int(os.environ.get("AGENT_MAX_TOKENS", "96"))))
        try:
            await Runner.run(agent, task["messages"], max_turns=int(os.environ.get("AGENT_MAX_TURNS", "4")))
        except MaxTurnsExceeded:
            return 0  # no final answer: the episode ends unanswered (reward 0)
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=300) as http:
        step = await http.post(f"{session_url}/step", json={})
        step.raise_for_status()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

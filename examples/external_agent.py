"""An external agent for ExternalAgentWorkflow: a separate program that speaks only OpenAI + HTTP.

    ExternalAgentWorkflow([sys.executable, "examples/external_agent.py"], model_dir, env_id="agentrl/ToolUse-v0")

It reads its task on stdin (``{"task", "messages", "tools"}``), calls the model with the
plain ``openai`` SDK — which finds the session in ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` —
and submits each reply to the environment with ``POST $AGENTRL_SESSION_URL/step``, appending
what the env answers (tool results, feedback) until the episode ends. Nothing here imports
agentrl: the same loop can be written in any language. ``AGENT_MAX_TOKENS`` (default 64)
and ``AGENT_TEMPERATURE`` (default 1.0) set its sampling.
"""

from __future__ import annotations

import json
import os
import sys

import httpx
from openai import NOT_GIVEN, OpenAI


def main() -> int:
    task = json.load(sys.stdin)
    session_url, key = os.environ["AGENTRL_SESSION_URL"], os.environ["OPENAI_API_KEY"]
    client = OpenAI(max_retries=0)
    messages, tools = list(task["messages"]), task.get("tools")
    with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=300) as http:
        while True:
            response = client.chat.completions.create(
                model="policy", messages=messages, tools=tools or NOT_GIVEN,
                max_tokens=int(os.environ.get("AGENT_MAX_TOKENS", "64")),
                temperature=float(os.environ.get("AGENT_TEMPERATURE", "1.0")))
            messages.append(response.choices[0].message.model_dump(exclude_none=True))
            step = http.post(f"{session_url}/step", json={"completion_id": response.id})
            step.raise_for_status()
            result = step.json()
            messages += result["messages"]
            if result["terminated"] or result["truncated"]:
                return 0


if __name__ == "__main__":
    sys.exit(main())

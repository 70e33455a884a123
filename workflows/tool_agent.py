"""ToolAgentWorkflow: an agent loop written only against the OpenAI chat interface, trained as is.

What it is: the proof that ordinary OpenAI-style agent code trains. Each episode hands
``ToolAgent.run`` — plain ``chat.completions.create`` / ``tool_calls`` / tool-result code, as
one writes it for ``openai.AsyncOpenAI`` — a ``ChatClient`` over the inference client. The
agent runs the env's tools itself through ``TextEnv.call_tool`` (the calculator, the price
lookup, the code sandbox's ``python``, an MCP server's tools), so the env counts each call
as its own, as it does the calls of a reply in ``EnvWorkflow``; it answers each
``tool_call`` with a ``role: tool`` message. A reply without tool calls is its answer,
which the env grades (and may answer, as MathRetry does, with another user turn). The
ChatClient records every call's exact tokens, so the trajectories are what the model saw
and sampled — one per segment when the agent's re-sent history does not render as sampled
(counted in ``segments_per_episode``).

Rewards: each env step's reward goes to the call whose answer it graded (a trajectory's
``turn_rewards``: 0 on a call that made tool calls); ``discount`` spreads returns over earlier
calls (default 1). Failures are data (env, sandbox, inference,
``timeout_s``). ``max_turns`` caps the agent's calls (``truncated_by/workflow``).

What it is not: a general agent framework; a user's own agent is a copy of ``ToolAgent.run``.

Main hook::

    wf = ToolAgentWorkflow("agentrl/ToolUse-v0", "examples/tiny-model", {"max_new_tokens": 96})
    trajectories = await wf.arun_episode(engine, row)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from openai import NOT_GIVEN

from agentrl.api import InferenceClient, SamplingParams, Trajectory
from agentrl.rollout.chat_client import ChatClient
from agentrl.rollout.episode import EnvEpisodes, step_metrics
from agentrl.toolcalls import DEFAULT_TOOL_PARSER


class ToolAgent:
    """The agent: OpenAI chat-completions code, nothing agentrl-specific in ``run``."""

    def __init__(self, client: Any, sampling: SamplingParams, max_turns: int) -> None:
        self.client, self.max_turns = client, max_turns
        self.settings: dict[str, Any] = {"max_tokens": sampling.max_new_tokens, "temperature": sampling.temperature,
                                         "top_p": sampling.top_p, "stop": sampling.stop or NOT_GIVEN,
                                         "seed": sampling.seed if sampling.seed is not None else NOT_GIVEN}
        if sampling.top_k != -1:
            self.settings["extra_body"] = {"top_k": sampling.top_k}

    async def run(self, messages: list[dict], tools: list[dict] | None, run_tool, answer) -> dict[str, Any]:
        """Chat until ``answer(text, completion_id)`` says the episode is over; returns its last result."""
        result: dict[str, Any] = {}
        for _ in range(self.max_turns):
            response = await self.client.chat.completions.create(
                model="policy", messages=messages, tools=tools or NOT_GIVEN, **self.settings)
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if message.tool_calls:
                for call in message.tool_calls:
                    messages.append({"role": "tool", "tool_call_id": call.id,
                                     "content": await run_tool(call.function.name, call.function.arguments)})
                continue
            result = await answer(message.content or "", response.id)
            if result["done"]:
                return result
            messages.extend(result["messages"])
        return {**result, "done": False, "cut": True}


class ToolAgentWorkflow(EnvEpisodes):
    """``ToolAgent`` on a registered env; see the module docstring.

    ``env_id``, ``tokenizer``, ``sampling``, ``env_kwargs``: as ``EnvWorkflow``'s;
    ``max_turns``: the agent's calls per episode; ``context_length``: prompt + reply limit of
    one call, replies cut to fit (None: the server's applies); ``timeout_s``: wall time of one
    episode; ``discount``: γ for returns over calls; ``max_idle_envs``: envs kept for reuse;
    ``tool_call_parser``/``reasoning_parser``: the formats replies are read in (``agentrl.toolcalls``).
    """

    run_inputs: ClassVar[tuple[str, ...]] = ("tokenizer", "sampling", "env_kwargs", "tool_call_parser",
                                             "reasoning_parser")
    """What it takes from a run (``agentrl.rollout.workflow_inputs``)."""

    def __init__(self, env_id: str, tokenizer: str | Path | Any, sampling: SamplingParams | Mapping | None = None,
                 env_kwargs: Mapping[str, Any] | None = None, *, max_turns: int = 8,
                 context_length: int | None = None, timeout_s: float = 900.0,
                 discount: float = 1.0, chat_template_kwargs: Mapping[str, Any] | None = None,
                 max_idle_envs: int = 256, tool_call_parser: str = DEFAULT_TOOL_PARSER,
                 reasoning_parser: str | None = None) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        super().__init__(env_id, tokenizer, sampling, env_kwargs, timeout_s=timeout_s,
                         chat_template_kwargs=chat_template_kwargs, max_idle_envs=max_idle_envs,
                         tool_call_parser=tool_call_parser, reasoning_parser=reasoning_parser)
        self.max_turns, self.discount = max_turns, discount
        self.context_length = context_length

    async def _play(self, client: InferenceClient, row: Mapping[str, Any]) -> list[Trajectory]:
        chat = ChatClient(client, self.renderer, context_length=self.context_length, timeout_s=None,
                          tool_call_parser=self.tool_call_parser, reasoning_parser=self.reasoning_parser)
        tool_calls = 0
        async with self.envs.lease() as env:
            self.read_replies(env)
            obs, info = await self.envs.reset(env, row)
            played = getattr(env, "unwrapped", env)
            toolbox = getattr(played, "toolbox", None)

            async def run_tool(name: str, arguments: str) -> str:
                nonlocal tool_calls
                tool_calls += 1
                try:
                    args = json.loads(arguments)
                except json.JSONDecodeError as e:
                    return f"error: the arguments are not JSON ({e.msg})"
                # the env's own tool path (TextEnv.call_tool): its MCP servers' tools, its counts and facts
                content, _ = await played.call_tool(name, args if isinstance(args, dict) else {})
                return content

            async def answer(text: str, completion_id: str) -> dict[str, Any]:
                obs, reward, terminated, truncated, step_info = await self.envs.step(env, text)
                chat.set_reward(completion_id, reward)
                return {"done": terminated or truncated, "messages": obs, "info": step_info,
                        "terminated": terminated, "truncated": truncated}

            agent = ToolAgent(chat, self.sampling, self.max_turns)
            tools = info.get("tools") if toolbox is not None else None
            result = await agent.run(list(obs), tools, run_tool, answer)
        chat.apply_reward_discount(self.discount)
        metrics = {"turns": float(len(chat.conversation.calls)), "tool_calls": float(tool_calls),
                   **step_metrics(result.get("info") or {}, terminated=bool(result.get("terminated")),
                                  truncated=bool(result.get("truncated")))}
        if result.get("cut"):
            metrics.update({"truncated": 1.0, "truncated_by/workflow": 1.0})
        trajectories = chat.export_trajectories("concat")
        for t in trajectories:
            t.metrics.update(metrics)
        return trajectories

"""EnvWorkflow: any registered multi-turn environment, played token-in token-out.

What it is: the workflow for ``agentrl/...`` environments (and any ``gymnasium`` env whose
observations are chat messages and whose action is the reply text). One episode::

    reset(options={"task": row}) → render → generate → step(reply) → render the new messages
    onto the tokens so far → generate → ... until terminated, truncated or max_turns

The whole episode is one exact token stream (``agentrl.rollout.TokenConversation``): every
sampled token, stop token included, is trained as sampled; the env's and tools' messages are
tokenized once, appended, and masked out of the loss. If the chat template renders history
differently from what was sampled, the episode is split into segments (one trajectory each)
rather than re-tokenized. The reply the env sees is the sampled text without special tokens
(stop strings kept); tool calls stay in the model's own format for the env to parse.

Rewards: each step's reward goes to the call that produced it and ``discount`` (default 1)
spreads it back over earlier calls, so every segment of an episode carries its return. A
trajectory's ``turn_rewards`` are its turns' step rewards and its reward their sum (plus the
return after it, when the episode was split; ``agentrl.rollout.conversation``), which
``trainer.advantages.kind: turn`` and ``gae`` read as per-turn credit.
With ``turn_states=True`` each trajectory names the state each of its turns acted in
(``Trajectory.turn_states``, for ``trainer.advantages.kind: turn``): the env's
``info["state_key"]`` from the reset or the previous step when it gives one, else a digest of
the conversation the turn answered (samples of one task share the first turn's state, and a
later one's where they replied alike).
Failures are data: an env, sandbox or inference failure, or a run past ``timeout_s``, comes
back as one failed trajectory whose status says which. An episode that reaches
``max_context_tokens`` ends truncated (reward 0, ``truncated_by/context``).

What it is not: an agent with its own loop over the OpenAI API (``workflows.tool_agent``).

Main hook (the training loop builds one from config and calls it concurrently)::

    wf = EnvWorkflow("agentrl/ToolUse-v0", "examples/tiny-model", {"max_new_tokens": 64})
    trajectories = await wf.arun_episode(engine, row)     # row: the env's task dict
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from agentrl.api import InferenceClient, Message, SamplingParams, Trajectory, TrajectoryStatus, sampled_spans
from agentrl.errors import EnvError
from agentrl.inference.wire import output_text
from agentrl.rollout.conversation import TokenConversation
from agentrl.rollout.episode import EnvEpisodes, step_metrics
from agentrl.toolcalls import DEFAULT_TOOL_PARSER


class EnvWorkflow(EnvEpisodes):
    """Reset, then generate and step until the env ends the episode; see the module docstring.

    ``env_id``: a registered env id; ``tokenizer``: a model directory or tokenizer object
    (its chat template renders the conversation); ``sampling``: ``SamplingParams`` or a
    mapping of its fields, per reply; ``env_kwargs``: passed to ``gymnasium.make``;
    ``max_turns``: a cap on replies on top of the env's own limits (None: the env decides);
    ``max_context_tokens``: prompt + reply of one call (None: the server's limit applies);
    ``timeout_s``: wall time of one episode; ``discount``: γ for returns over calls;
    ``chat_template_kwargs``: extra template variables; ``max_idle_envs``: envs kept for reuse;
    ``turn_states``: fill ``Trajectory.turn_states`` (the turn-level estimator's step groups, module
    docstring).
    """

    run_inputs: ClassVar[tuple[str, ...]] = ("tokenizer", "sampling", "env_kwargs", "tool_call_parser",
                                             "reasoning_parser")
    """What it takes from a run (``agentrl.rollout.workflow_inputs``)."""

    def __init__(self, env_id: str, tokenizer: str | Path | Any, sampling: SamplingParams | Mapping | None = None,
                 env_kwargs: Mapping[str, Any] | None = None, *, max_turns: int | None = None,
                 max_context_tokens: int | None = None, timeout_s: float = 900.0, discount: float = 1.0,
                 chat_template_kwargs: Mapping[str, Any] | None = None, max_idle_envs: int = 256,
                 tool_call_parser: str = DEFAULT_TOOL_PARSER, reasoning_parser: str | None = None,
                 turn_states: bool = False) -> None:
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"max_turns must be >= 1 or None, got {max_turns}")
        if not 0.0 <= discount <= 1.0:
            raise ValueError(f"discount must be in [0, 1], got {discount}")
        super().__init__(env_id, tokenizer, sampling, env_kwargs, timeout_s=timeout_s,
                         chat_template_kwargs=chat_template_kwargs, max_idle_envs=max_idle_envs,
                         tool_call_parser=tool_call_parser, reasoning_parser=reasoning_parser)
        self.max_turns = max_turns
        self.max_context_tokens = max_context_tokens
        self.discount = discount
        self.turn_states = turn_states

    async def _play(self, client: InferenceClient, row: Mapping[str, Any]) -> list[Trajectory]:
        async with self.envs.lease() as env:
            keep_special = self.read_replies(env)
            obs, info = await self.envs.reset(env, row)
            if "seat" in info:
                raise EnvError(f"{self.envs.env_id} is a game whose every seat the policy plays (its reset info "
                               "names a 'seat'); play it with workflows.self_play:SelfPlayWorkflow, or give the "
                               "env fixed opponents")
            tools = info.get("tools")
            messages: list[Message] = list(obs)
            conv = TokenConversation(self.renderer)
            states: dict[str, str] = {}  # call id -> the state it acted in (turn_states)
            turns, terminated, truncated, out_of_context, step_info = 0, False, False, False, {}
            while True:
                prompt = conv.prompt(await self.renderer.arender(messages, tools))
                sampling = self._sampling_for(len(prompt.ids))
                if sampling is None:
                    if not conv.calls:
                        return [Trajectory.failed(TrajectoryStatus.ENV_ERROR, error=(
                            f"the first prompt has {len(prompt.ids)} tokens, over max_context_tokens="
                            f"{self.max_context_tokens}"))]
                    out_of_context = True
                    break
                completion = await client.generate(prompt.ids, sampling)
                call = conv.record(prompt, completion)
                if self.turn_states:
                    states[call.id] = state_key(info if turns == 0 else step_info, messages, tools)
                reply = output_text(lambda ids: self.renderer.decode(ids, skip_special_tokens=not keep_special),
                                    completion.tokens, completion.finish_reason, completion.matched_stop,
                                    no_stop_trim=not keep_special)
                obs, reward, terminated, truncated, step_info = await self.envs.step(env, reply)
                conv.set_reward(call.id, reward)
                turns += 1
                messages.append({"role": "assistant", "content": reply})
                messages.extend(obs)
                if terminated or truncated or (self.max_turns is not None and turns >= self.max_turns):
                    break
        conv.apply_reward_discount(self.discount)
        metrics = {"turns": float(turns), **step_metrics(step_info, terminated=terminated, truncated=truncated)}
        if not (terminated or truncated):  # cut here, not by the env: no final reward was given
            metrics.update({"truncated": 1.0, "truncated_by/context" if out_of_context else "truncated_by/workflow": 1.0})
        trajectories = conv.export("concat")
        for t in trajectories:
            t.metrics.update(metrics)
        if self.turn_states:
            for t, seg in zip(trajectories, [s for s in conv.segments if s.calls], strict=True):
                keys = [states[c.id] for c in seg.calls]
                if len(keys) == len(sampled_spans(t.loss_mask)):  # else a call left no sampled run of its own
                    t.turn_states = keys
        return trajectories

    def _sampling_for(self, prompt_len: int) -> SamplingParams | None:
        """This call's sampling: the reply budget cut to the context left (None: nothing left)."""
        if self.max_context_tokens is None:
            return self.sampling
        room = self.max_context_tokens - prompt_len
        if room <= 0:
            return None
        if room >= self.sampling.max_new_tokens:
            return self.sampling
        return dataclasses.replace(self.sampling, max_new_tokens=room)


def state_key(info: Mapping[str, Any], messages: list[Message], tools: Any) -> str:
    """The state a turn acts in: the env's own ``info["state_key"]`` (from the reset or the step
    before the turn) when it gives one, else a digest of everything the turn answered (the
    messages so far and the tools): equal keys, equal states."""
    if isinstance(info.get("state_key"), str):
        return info["state_key"]
    text = json.dumps([messages, tools], sort_keys=True, default=str)
    return "history:" + hashlib.sha256(text.encode()).hexdigest()[:16]

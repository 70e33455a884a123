"""SelfPlayWorkflow: a multi-seat game where the policy plays every seat, one trajectory per seat.

What it is: the workflow for envs whose observations belong to seats (a TextArena game with
no fixed opponents, ``textarena/TicTacToe-v0``). The env says whose turn it is in
``info["seat"]`` (reset's and each step's), the step's messages are for that seat, and the step
that ends the game gives ``info["seat_rewards"]``. Each seat is its own conversation and its own
exact token stream (``TokenConversation``): its prompts hold only what that seat was shown and
what it replied; its trajectory carries that seat's reward (0 when agentrl's turn, token,
time or context cap ends the game before it does). An episode returns one trajectory per seat
that moved, all of one game, so they land in the same group; ``metrics["seat"]`` says which.

What it is not: a league (fixed opponents are the env's ``opponents`` argument, played inside
the env; such an env is a one-seat env for ``workflows.env:EnvWorkflow``).

Main hook::

    wf = SelfPlayWorkflow("textarena/TicTacToe-v0", "examples/tiny-model", {"max_new_tokens": 16})
    trajectories = await wf.arun_episode(engine, {"seed": 3})    # one per seat
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from agentrl.api import InferenceClient, Message, SamplingParams, Trajectory, TrajectoryStatus
from agentrl.rollout.conversation import TokenConversation
from agentrl.rollout.episode import EnvEpisodes, step_metrics


class SelfPlayWorkflow(EnvEpisodes):
    """Every seat of a game played by the policy; see the module docstring.

    ``env_id``, ``tokenizer``, ``sampling``, ``env_kwargs``, ``timeout_s``, ``chat_template_kwargs``
    and ``max_idle_envs`` as ``EnvWorkflow``'s; ``max_context_tokens``: prompt + reply of one call
    (a seat whose next prompt would not fit ends the game, truncated).
    """

    run_inputs: ClassVar[tuple[str, ...]] = ("tokenizer", "sampling", "env_kwargs")
    """What it takes from a run (``agentrl.rollout.workflow_inputs``)."""

    def __init__(self, env_id: str, tokenizer: str | Path | Any, sampling: SamplingParams | Mapping | None = None,
                 env_kwargs: Mapping[str, Any] | None = None, *, max_context_tokens: int | None = None,
                 timeout_s: float = 900.0, chat_template_kwargs: Mapping[str, Any] | None = None,
                 max_idle_envs: int = 256) -> None:
        super().__init__(env_id, tokenizer, sampling, env_kwargs, timeout_s=timeout_s,
                         chat_template_kwargs=chat_template_kwargs, max_idle_envs=max_idle_envs)
        self.max_context_tokens = max_context_tokens

    async def _play(self, client: InferenceClient, row: Mapping[str, Any]) -> list[Trajectory]:
        convs: dict[int, TokenConversation] = {}
        messages: dict[int, list[Message]] = {}
        last_call: dict[int, str] = {}
        async with self.envs.lease() as env:
            obs, info = await self.envs.reset(env, row)
            seat = int(info.get("seat", 0))
            messages[seat] = list(obs)
            turns, terminated, truncated, out_of_context, step_info = 0, False, False, False, {}
            while True:
                if seat not in convs:
                    convs[seat] = TokenConversation(self.renderer)
                conv = convs[seat]
                prompt = conv.prompt(await self.renderer.arender(messages[seat], None))
                room = None if self.max_context_tokens is None else self.max_context_tokens - len(prompt.ids)
                if room is not None and room <= 0:
                    if not last_call:
                        return [Trajectory.failed(TrajectoryStatus.ENV_ERROR, error=(
                            f"the first prompt has {len(prompt.ids)} tokens, over max_context_tokens="
                            f"{self.max_context_tokens}"))]
                    out_of_context = True
                    break
                sampling = self.sampling if room is None or room >= self.sampling.max_new_tokens else \
                    dataclasses.replace(self.sampling, max_new_tokens=room)
                completion = await client.generate(prompt.ids, sampling)
                last_call[seat] = conv.record(prompt, completion).id
                reply = self.renderer.decode(completion.tokens, skip_special_tokens=True)
                obs, _, terminated, truncated, step_info = await self.envs.step(env, reply)
                messages[seat].append({"role": "assistant", "content": reply})
                turns += 1
                if terminated or truncated:
                    break
                seat = int(step_info.get("seat", seat))
                messages.setdefault(seat, []).extend(obs)
        seat_rewards = {int(s): float(r) for s, r in (step_info.get("seat_rewards") or {}).items()}
        metrics = {"turns": float(turns), **step_metrics(step_info, terminated=terminated, truncated=truncated)}
        if not (terminated or truncated):
            metrics.update({"truncated": 1.0, "truncated_by/context" if out_of_context else "truncated_by/workflow": 1.0})
        trajectories = []
        for s, conv in sorted(convs.items()):
            if s not in last_call:
                continue
            conv.set_reward(last_call[s], seat_rewards.get(s, 0.0))
            for t in conv.export("concat"):
                t.metrics.update(metrics, seat=float(s))
                trajectories.append(t)
        return trajectories

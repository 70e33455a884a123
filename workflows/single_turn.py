"""SingleTurnWorkflow: prompt → one completion → the environment's reward.

What it is: the workflow for single-turn tasks (``agentrl/Arith-v0``, ``Math-v1``, ``Code-v0``).
One episode resets the env on the row, renders its opening messages with the chat template
(tools included when the env offers them), samples one reply, and steps the env once with
it. The trajectory is prompt (loss mask 0) + the sampled tokens exactly as sampled, stop
token included (loss mask 1, the server's logprobs and policy versions), rewarded with what
that step returned. On a multi-turn env the episode still ends after the first reply: the
reward is whatever the env gave for it (0 when the env wanted more) and the metrics say
``truncated_by/workflow``.

Failures are data (env, sandbox or inference failure, ``timeout_s``): one failed trajectory.
What it is not: a multi-turn loop (``workflows.env.EnvWorkflow``).

Main hook::

    wf = SingleTurnWorkflow("agentrl/Arith-v0", "examples/tiny-model", {"max_new_tokens": 12})
    [trajectory] = await wf.arun_episode(engine, {"question": "What is 1+2?", "answer": "3"})
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from agentrl.api import NOT_SAMPLED, InferenceClient, SamplingParams, Trajectory
from agentrl.rollout.episode import EnvEpisodes, step_metrics


class SingleTurnWorkflow(EnvEpisodes):
    """Reset, one reply, one step; see the module docstring.

    ``env_id``: a registered env id; ``tokenizer``: a model directory or tokenizer object;
    ``sampling``: ``SamplingParams`` or a mapping of its fields; ``env_kwargs``: passed to
    ``gymnasium.make``; ``timeout_s``: wall time of one episode; ``chat_template_kwargs``:
    extra template variables; ``max_idle_envs``: envs kept for reuse.
    """

    run_inputs: ClassVar[tuple[str, ...]] = ("tokenizer", "sampling", "env_kwargs")
    """What it takes from a run (``agentrl.rollout.workflow_inputs``)."""

    def __init__(self, env_id: str, tokenizer: str | Path | Any, sampling: SamplingParams | Mapping | None = None,
                 env_kwargs: Mapping[str, Any] | None = None, *, timeout_s: float = 600.0,
                 chat_template_kwargs: Mapping[str, Any] | None = None, max_idle_envs: int = 256) -> None:
        super().__init__(env_id, tokenizer, sampling, env_kwargs, timeout_s=timeout_s,
                         chat_template_kwargs=chat_template_kwargs, max_idle_envs=max_idle_envs)

    async def _play(self, client: InferenceClient, row: Mapping[str, Any]) -> list[Trajectory]:
        async with self.envs.lease() as env:
            obs, info = await self.envs.reset(env, row)
            prompt = self.renderer.encode(await self.renderer.arender(obs, info.get("tools")))
            out = await client.generate(prompt, self.sampling)
            reply = self.renderer.decode(out.tokens, skip_special_tokens=True)
            _, reward, terminated, truncated, step_info = await self.envs.step(env, reply)
        metrics = {"turns": 1.0, "calls": 1.0, "calls_truncated": float(out.finish_reason == "length"),
                   **step_metrics(step_info, terminated=terminated, truncated=truncated)}
        if not (terminated or truncated):
            metrics.update({"truncated": 1.0, "truncated_by/workflow": 1.0})
        n = len(prompt)
        return [Trajectory(prompt + out.tokens, [0] * n + [1] * len(out.tokens), [0.0] * n + list(out.logprobs),
                           [NOT_SAMPLED] * n + list(out.versions), reward=float(reward), num_turns=1,
                           metrics=metrics)]

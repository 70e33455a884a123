"""A task of your own, trained end to end: environment, reward, workflow and config in one file.

    python examples/custom_task.py [key=value ...]      (e.g. steps=20 run_dir=runs/mine)

The task: two-term sums (``What is 17+72?``), which the tiny demo model gets right less often
than three-term ones, with a shaped reward — full credit for the exact answer, partial credit
for an answer within 2 of it. The pieces, top to bottom:

1. ``SumEnv`` — a ``TextEnv``: ``_start`` opens the episode, ``_turn`` grades the reply; the
   reward is a ``Rubric`` of named, weighted terms computed from the turn's facts.
2. ``rows(seed)`` — the dataset: one dict per episode, passed to ``reset(options={"task": row})``.
   Importing this module registers the env, so naming ``custom_task:rows`` in the config makes
   every process of the run (the trainer ranks too) know ``examples/Sum-v0``.
3. ``OneShotWorkflow`` — how an episode is played, written against the ``InferenceClient``
   protocol: render the prompt, generate, step the env, return one ``Trajectory`` whose loss
   mask covers exactly the sampled tokens. (``workflows.env:EnvWorkflow`` does this and more —
   multi-turn, tools, segments; this is the smallest complete one.)
4. ``CONFIG`` — the run, as ``agentrl train`` reads it from YAML; ``key=value`` overrides apply.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import gymnasium

from agentrl.api import NOT_SAMPLED, SamplingParams, Trajectory
from agentrl.env import EpisodeLimits, Reward, Rubric, TextEnv, Turn, fact
from agentrl.model.arith_data import extract_answer, generate_problems

HERE = Path(__file__).resolve().parent


class SumEnv(TextEnv):
    """Two-term sums, answered in one turn as ``\\boxed{N}``; partial credit within 2.

    ## Description
    ``What is 17+72?``; the reply's last ``\\boxed{}`` holds the answer.
    ## Action Space / ## Observation Space
    ``Text`` / ``Messages``: the question as one user message.
    ## Starting State
    ``options["task"]`` (a row of ``rows``), else a problem drawn from the seed.
    ## Rewards
    ``correct`` (1.0) when the boxed integer is the sum; ``close`` (0.3) when it is off by 1 or 2.
    ## Episode End
    After the first reply.
    ## Information / ## Arguments
    ``correct``, ``close`` and ``rewards`` in the step's info; ``render_mode``.
    ## Version History
    * v0: initial version.
    """

    def __init__(self, render_mode: str | None = None) -> None:
        rubric = Rubric([Reward("correct", fact("correct")), Reward("close", fact("close"), 0.3)])
        super().__init__(rubric=rubric, limits=EpisodeLimits(max_turns=1), render_mode=render_mode)

    def sample_task(self) -> dict[str, Any]:
        return rows(int(self.np_random.integers(2**31)), n=1)[0]

    async def _start(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "user", "content": task["question"]}]

    async def _turn(self, action: str) -> Turn:
        answer, gold = extract_answer(action), int(self.task["answer"])
        off = None if answer is None else abs(answer - gold)
        return Turn(done=True, facts={"correct": off == 0, "close": off in (1, 2)})


if "examples/Sum-v0" not in gymnasium.registry:  # run as a script, then imported by name
    gymnasium.register("examples/Sum-v0", entry_point=SumEnv)


def rows(seed: int, n: int = 5000) -> list[dict[str, Any]]:
    """Held-out two-term problems (never in the model's supervised data)."""
    return [p.to_row() for p in generate_problems(n, seed=seed, num_terms=(2,))]


def eval_rows(seed: int) -> list[dict[str, Any]]:
    return rows(seed=123_457, n=300)


class OneShotWorkflow:
    """One prompt, one reply, the env's reward."""

    run_inputs = ("tokenizer", "sampling")  # the run gives the model directory and rollout.sampling

    def __init__(self, tokenizer: str, sampling: SamplingParams, env_id: str = "examples/Sum-v0") -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        self.sampling, self.env_id = sampling, env_id

    async def arun_episode(self, client, row: dict[str, Any]) -> list[Trajectory]:
        env = gymnasium.make(self.env_id).unwrapped
        try:
            messages, _ = await env.areset(options={"task": row})
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            prompt = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out = await client.generate(prompt, self.sampling)
            reply = self.tokenizer.decode(out.tokens, skip_special_tokens=True)
            _, reward, _, _, info = await env.astep(reply)
        finally:
            await env.aclose()
        n = len(prompt)
        return [Trajectory(prompt + out.tokens, [0] * n + [1] * len(out.tokens), [0.0] * n + out.logprobs,
                           [NOT_SAMPLED] * n + out.versions, reward=float(reward),
                           metrics={"success": float(info["correct"])})]


CONFIG: dict[str, Any] = {
    "model": str(HERE / "tiny-model"),
    "run_dir": "runs/custom_task",
    "steps": 30,
    "rollout": {"workflow": "custom_task:OneShotWorkflow", "dataset": "custom_task:rows",
                "group_size": 16, "batch_size": 8, "sampling": {"temperature": 1.0, "max_new_tokens": 12}},
    "trainer": {"lr": 5e-5, "betas": [0.9, 0.99], "max_staleness": 1, "min_lr_ratio": 1.0},
    "eval": {"dataset": "custom_task:eval_rows", "sampling": {"temperature": 0.0, "max_new_tokens": 12}},
    "checkpoint": {"every_steps": 0},
}


def main(argv: list[str]) -> int:
    import json

    from agentrl.config import apply_overrides, from_dict, save_config
    from agentrl.run.local_launcher import launch
    from agentrl.run.run_config import RunConfig, check_run_config

    data = apply_overrides(json.loads(json.dumps(CONFIG)), argv)  # key=value, as on agentrl train's line
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(HERE))
    cfg = from_dict(RunConfig, data)
    check_run_config(cfg)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    print(json.dumps(launch(cfg, run_dir)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

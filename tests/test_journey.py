"""A newcomer's task, end to end through the command line alone (issue 31, "Done when").

A user writes a task in a directory of their own — nothing of it in the agentrl repository, no
PYTHONPATH — as the README says: one module that subclasses ``TextEnv``, registers its id with
``gymnasium.register`` at import, and gives a dataset function; and a YAML that names them by
``module:ns/Name-vN`` and ``module:function``. Then, from that directory, as subprocesses of the
``agentrl`` console script: ``agentrl envs check``, ``agentrl train`` (two tiny steps on the
committed tiny model) and ``agentrl eval``. Before issue 31 the check answered ``no environment
'journey/Guess-v0'`` and the run ``module 'guess' not found``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AGENTRL = str(Path(sys.executable).parent / "agentrl")

GUESS = '''\
"""journey/Guess-v0: guess the hidden number, which is the sum the question asks for."""
import gymnasium
from agentrl.env import EpisodeLimits, Reward, Rubric, TextEnv, Turn, fact


class GuessEnv(TextEnv):
    """Guess the hidden number: the sum of two numbers the question names.

    ## Description
    The user hides a number and says it is a+b; the assistant answers with \\\\boxed{N}.
    ## Action Space
    The assistant's reply, a string.
    ## Observation Space
    Chat messages: one user message, "What is a+b?".
    ## Starting State
    The row's task, or two operands 0..99 drawn from the seed.
    ## Rewards
    ``correct``: 1.0 when the boxed number is the hidden one, else 0.0.
    ## Episode End
    After the first reply.
    ## Information
    ``info["rewards"]``: each reward term by name.
    ## Arguments
    ``render_mode``: unused.
    ## Version History
    * v0: first version.
    """

    def __init__(self, render_mode=None):
        super().__init__(rubric=Rubric([Reward("correct", fact("correct"))]),
                         limits=EpisodeLimits(max_turns=1), render_mode=render_mode)

    def sample_task(self):
        a, b = (int(x) for x in self.np_random.integers(100, size=2))
        return {"a": a, "b": b}

    async def _start(self, task):
        return [{"role": "user", "content": f"What is {task['a']}+{task['b']}?"}]

    async def _turn(self, action):
        hidden = self.task["a"] + self.task["b"]
        return Turn(done=True, facts={"correct": action.strip().startswith(f"\\\\boxed{{{hidden}}}")})


gymnasium.register("journey/Guess-v0", entry_point=GuessEnv)


def rows(seed: int) -> list[dict]:
    """The run's tasks: rows for reset(options={"task": row})."""
    import random

    rng = random.Random(seed)
    return [{"a": rng.randrange(100), "b": rng.randrange(100)} for _ in range(200)]
'''

CONFIG = """\
model: {model}
run_dir: runs/guess
steps: 2
max_minutes: null
world_size: 1
threads: 1
inference: {{num_servers: 1, threads: 1}}
rollout:
  workflow: workflows.env:EnvWorkflow
  workflow_args: {{env_id: "guess:journey/Guess-v0"}}
  dataset: guess:rows
  group_size: 4
  batch_size: 2
  sampling: {{temperature: 1.0, max_new_tokens: 12}}
eval:
  dataset: guess:rows
  limit: 6
  sampling: {{temperature: 0.0, max_new_tokens: 12}}
checkpoint: {{every_steps: 0}}
logging: {{tensorboard: false, trajectories_per_step: 2}}
"""


def test_a_task_written_outside_the_repo_is_checked_trained_and_evaluated_by_the_cli(tmp_path):
    (tmp_path / "guess.py").write_text(GUESS)
    (tmp_path / "guess.yaml").write_text(CONFIG.format(model=ROOT / "examples" / "tiny-model"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as a user's shell: only the directory

    def agentrl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([AGENTRL, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=timeout)

    check = agentrl("envs", "check", "guess:journey/Guess-v0")
    assert check.returncode == 0 and check.stdout.strip().endswith("journey/Guess-v0: ok"), \
        check.stdout + check.stderr

    train = agentrl("train", "guess.yaml", timeout=600)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    summary = json.loads(train.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["counters"]["episodes_failed"] == 0, summary
    assert summary["eval_before"] is not None and summary["eval_after"] is not None
    run_dir = tmp_path / "runs" / "guess"  # relative to the user's directory
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["rollout/trajectories"] == 2 * 4 and r["rollout/failed"] == 0 for r in steps), steps
    sampled = json.loads((run_dir / "trajectories" / "step_000001.jsonl").read_text().splitlines()[0])
    assert "What is " in "".join(sampled["tokens"])  # the user's env spoke, not another

    out = tmp_path / "guess-eval"
    evaluated = agentrl("eval", "guess.yaml", "--out", str(out), "--k", "2", "eval.sampling.temperature=1.0")
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    report = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert report["problems"] == 6 and report["failed_episodes"] == 0 and 0.0 <= report["pass@2"] <= 1.0, report
    problems = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert sorted(p["index"] for p in problems) == list(range(6)) and all(p["k"] == 2 for p in problems)
    assert {tuple(sorted(p["row"])) for p in problems} == {("a", "b")}  # the user's rows

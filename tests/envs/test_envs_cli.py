"""`agentrl envs` as a user types it: a real subprocess of the console script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

AGENTRL = str(Path(sys.executable).parent / "agentrl")
ECOSYSTEM_FORMS = ["reasoning_gym/<task>", "textarena/<Game-vN>", "skyrl_gym/<id>", "openenv:<URL>", "verifiers:<taskset>"]


def agentrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([AGENTRL, *args], capture_output=True, text=True, timeout=300)


def test_list_prints_one_line_per_env_then_one_per_ecosystem():
    r = agentrl("envs")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["agentrl/Arith-v0", "agentrl/ArithRetry-v0", "agentrl/Code-v0", "agentrl/CodeAgent-v0",
                                                   "agentrl/Math-v1", "agentrl/MathRetry-v1", "agentrl/Repo-v0", "agentrl/ToolUse-v0",
                                                   *ECOSYSTEM_FORMS]
    assert all(len(line.split(maxsplit=1)) == 2 for line in lines)  # each has a summary


def test_check_passes_and_bad_input_is_explained():
    r = agentrl("envs", "check", "agentrl/ToolUse-v0", "--kwargs", '{"max_turns": 2}')
    assert r.returncode == 0 and r.stdout.strip().endswith("agentrl/ToolUse-v0: ok"), r.stdout + r.stderr
    r = agentrl("envs", "check", "agentrl/Tooluse-v0")
    assert r.returncode == 2 and "did you mean 'agentrl/ToolUse-v0'" in r.stderr
    r = agentrl("envs", "check", "agentrl/Arith-v0", "--kwargs", "{max_turns: 2}")
    assert r.returncode == 2 and "--kwargs must be a JSON object" in r.stderr
    r = agentrl("envs", "check", "agentrl/Arith-v0", "--kwargs", '{"max_trns": 2}')
    assert r.returncode == 2 and "max_trns" in r.stderr and "Traceback" not in r.stderr


GUESS = '''
import gymnasium
from agentrl.env import EpisodeLimits, Reward, Rubric, TextEnv, Turn, fact

DOC = """Guess the hidden number.

## Description
x
## Action Space
x
## Observation Space
x
## Starting State
x
## Rewards
x
## Episode End
x
## Information
x
## Arguments
x
## Version History
x
"""

class Guess(TextEnv):
    __doc__ = DOC
    SEEDED = True

    def __init__(self, render_mode=None):
        super().__init__(rubric=Rubric([Reward("correct", fact("correct"))]),
                         limits=EpisodeLimits(max_turns=1), render_mode=render_mode)

    def sample_task(self):
        return {"n": int(self.np_random.integers(100)) if self.SEEDED else 7}

    async def _start(self, task):
        return [{"role": "user", "content": "Guess my number (0-99)."}]

    async def _turn(self, action):
        return Turn(done=True, facts={"correct": action.strip() == str(self.task["n"])})

class Seedless(Guess):
    SEEDED = False

class Plain(Guess):
    """Guess the hidden number (a docstring without Gymnasium's sections)."""

gymnasium.register("journey/Guess-v0", entry_point=Guess)
gymnasium.register("journey/Seedless-v0", entry_point=Seedless)
gymnasium.register("journey/Plain-v0", entry_point=Plain)
'''


def test_a_hidden_task_env_outside_the_repo_is_checked_by_its_tasks(tmp_path):
    """Issue 31: an env of the user's (not agentrl/*) is checked by ``module:id``; a game whose
    opening message is the same for every seed passes when its hidden tasks differ, and one
    whose seed chooses nothing fails with a message that says what was compared and the fix."""
    (tmp_path / "guess.py").write_text(GUESS)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([AGENTRL, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path)

    r = run("envs", "check", "guess:journey/Guess-v0")
    assert r.returncode == 0 and r.stdout.strip().endswith("journey/Guess-v0: ok"), r.stdout + r.stderr
    r = run("envs", "check", "guess:journey/Seedless-v0")
    assert r.returncode == 1 and "same opening messages" in r.stdout and "self.np_random" in r.stdout, r.stdout
    r = run("envs", "check", "guess:journey/Gues-v0")
    assert r.returncode == 2 and "did you mean 'journey/Guess-v0'" in r.stderr, r.stderr


def test_a_users_env_without_gymnasiums_docstring_sections_gets_advice_not_a_failure(tmp_path):
    """Issue 43: our docstring style is ours; a user's env that lacks the sections passes the
    check, with one line of advice naming the sections it lacks."""
    (tmp_path / "guess.py").write_text(GUESS)
    r = subprocess.run([AGENTRL, "envs", "check", "guess:journey/Plain-v0"], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip().endswith("journey/Plain-v0: ok"), r.stdout + r.stderr
    [advice] = [line for line in r.stdout.splitlines() if line.startswith("ADVICE")]
    assert "docstring lacks the Gymnasium sections" in advice and "'Version History'" in advice
    assert "FAIL" not in r.stdout

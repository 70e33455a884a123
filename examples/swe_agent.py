"""The software-engineering example's data: tiny repositories with a bug, and scripted agents' trajectories.

Tasks: ``envs/repo/tiny_repos.py`` — a one-module repository (``calc.py``: three short
functions), its tests (``test_calc.py``), one bug of the generator's kinds in one function,
graded by hidden tests in a fresh container. They are SWE-bench rows that ``agentrl/Repo-v0``
plays as it plays any: a container per episode (the warm pool), the tools ``bash`` and
``submit``, the reward 1 when swebench's grading says resolved. ``ENV_KWARGS`` keep every
prompt and observation short for the tiny model's 1,024-token context: the prompt is the
problem statement alone, the tools' descriptions are one line and a command's output is
cut past 300 bytes.

The supervised stage (``examples/swe_agent_sft.yaml``) learns from scripted agents' episodes,
their observations as the container gives them (tests/envs/test_tiny_repos.py checks): ``GOOD``
runs the tests, reads which test fails, prints that function with its line numbers (``grep -n -A3
'def NAME('``), replaces the buggy line by its number (``sed -i 'Ns|.*|FIXED|'``), runs the tests
again and submits; ``BLIND`` prints the whole module numbered (``cat -n``) and fixes it without
running the tests; ``WRONG`` runs the tests and then "fixes" a function they did not name;
``RUSHED`` submits at once. The edit copies a line number from the output just above it and writes
the function's correct line (the same for every repository that has the function): a short
copy, not the buggy line copied out of the whole printed module. ``SHARES`` are tuned like the
other examples' (a minority of good episodes): every repository's prompt is the same, so the SFT
model's first reply is submit in some samples and runs the tests in the rest — room for RL to
learn that running the tests and fixing what they name pays.

Pools: SFT and RL repositories from the *train* split (different seeds), held-out repositories
from the *heldout* split (``tiny_repos.split_of``: module compositions RL never saw).

    python -m examples.swe_agent > /tmp/swe.jsonl     # the SFT conversations as JSONL
"""

from __future__ import annotations

import functools
import json
import random
import re
import sys
from typing import Any

from envs.repo import tiny_repos

ENV_KWARGS: dict[str, Any] = {"tools": ["bash", "submit"], "prompt": "{instruction}", "max_output": 300,
                              "max_turns": 6, "command_timeout_s": 30.0, "eval_timeout_s": 120.0, "warm": 2,
                              "tool_descriptions": {"bash": "Run a shell command.", "submit": "Submit your fix."}}
"""``agentrl/Repo-v0``'s arguments here (the configs' ``env_kwargs`` repeat them)."""
TEST = "python3 -m pytest"
GREP_AFTER = 3  # lines grep prints after a def: the longest function's body
GOOD, BLIND, WRONG, RUSHED = "good", "blind", "wrong", "rushed"
SHARES = {RUSHED: 0.55, GOOD: 0.3, BLIND: 0.1, WRONG: 0.05}
"""Shares of the scripted agents in the SFT conversations: a minority run the tests first (see the module docstring)."""
RL_FIRST_SEED, SFT_FIRST_SEED = 1_000_000, 0


@functools.lru_cache(maxsize=1)
def _schemas() -> str:
    from envs.repo.env import RepoEnv

    return json.dumps(RepoEnv(**{k: v for k, v in ENV_KWARGS.items() if k != "warm"}).toolbox.schemas())


def _tools() -> list[dict[str, Any]]:
    """The OpenAI schemas Repo-v0 offers with ``ENV_KWARGS`` (what the chat template renders)."""
    return json.loads(_schemas())


def pytest_output(row: dict[str, Any], failing: list[str]) -> str:
    """What ``python3 -m pytest`` prints in the container (``tiny_repos.PYTEST_INI``), its time fixed."""
    names = re.findall(r"^def test_(\w+)\(", row["files"][tiny_repos.TESTS], re.MULTILINE)
    dots = "".join("F" if n in failing else "." for n in names)
    if not failing:
        return f"{dots}\n{len(names)} passed in 0.05s\n"
    lines = [dots, "=" * 27 + " short test summary info " + "=" * 28]
    lines += [f"FAILED test_calc.py::test_{n} - {failing_assert(row, n)}" for n in failing]
    passed = len(names) - len(failing)
    return "\n".join(lines) + f"\n{len(failing)} failed, {passed} passed in 0.05s\n\n[exit code 1]"


def failing_assert(row: dict[str, Any], name: str) -> str:
    """pytest's message for ``test_<name>`` on the buggy module: ``assert <got> == <expected>`` of its first wrong assert."""
    scope: dict[str, Any] = {}
    exec(row["files"][tiny_repos.MODULE], scope)  # noqa: S102 - the generated module
    for call, expected in re.findall(rf"assert ({name}\([^)]*\)) == (.+)$", row["files"][tiny_repos.TESTS], re.MULTILINE):
        try:
            got = eval(call, scope)  # noqa: S307 - the generated test's call
        except Exception as e:  # noqa: BLE001 - pytest shows the error
            return f"{type(e).__name__}: {e}"
        if repr(got) != expected:
            return f"assert {got!r} == {expected}"
    raise ValueError(f"test_{name} passes on {row['instance_id']}")


def grep_function(source: str, name: str) -> tuple[str, str]:
    """``grep -n -A3 'def NAME(' calc.py`` and what it prints on ``source``: the function's lines, numbered."""
    lines = source.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(f"def {name}("))
    shown = [f"{first + 1}:{lines[first]}"]
    shown += [f"{i + 1}-{lines[i]}" for i in range(first + 1, min(first + 1 + GREP_AFTER, len(lines)))]
    return f"grep -n -A{GREP_AFTER} 'def {name}(' {tiny_repos.MODULE}", "\n".join(shown) + "\n"


def cat_numbered(source: str) -> tuple[str, str]:
    """``cat -n calc.py`` and what it prints on ``source``."""
    return f"cat -n {tiny_repos.MODULE}", "".join(f"{i:6d}\t{line}\n" for i, line in enumerate(source.splitlines(), 1))


def line_fix(number: int, new_line: str) -> str:
    """``sed -i 'Ns|.*|NEW|' calc.py``: line ``number`` (1-based, as grep numbers it) replaced by ``new_line``."""
    return f"sed -i '{number}s|.*|{new_line}|' {tiny_repos.MODULE}"


def _call(rng: random.Random, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"call_{rng.randrange(16 ** 8):08x}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def conversation(row: dict[str, Any], agent: str, rng: random.Random) -> dict[str, Any]:
    """One scripted agent's episode on ``row``: its messages, the tool turns as the container answers."""
    buggy, fixed = row["files"][tiny_repos.MODULE].split("\n"), row["fixed"].split("\n")
    line = next(i for i, (a, b) in enumerate(zip(buggy, fixed, strict=True)) if a != b)
    messages: list[dict[str, Any]] = [{"role": "user", "content": tiny_repos.PROBLEM}]

    def bash(command: str, output: str) -> None:
        call = _call(rng, "bash", {"command": command})
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})

    if agent in (GOOD, WRONG):
        bash(TEST, pytest_output(row, [row["function"]]))
    if agent == GOOD:
        bash(*grep_function(row["files"][tiny_repos.MODULE], row["function"]))
    if agent == BLIND:
        bash(*cat_numbered(row["files"][tiny_repos.MODULE]))
    if agent in (GOOD, BLIND):
        bash(line_fix(line + 1, fixed[line]), "")
    if agent == WRONG:  # a function the tests did not name, a line of it "fixed" into a bug of its own
        name = rng.choice(json.loads(row["PASS_TO_PASS"])).removeprefix("test_calc.py::test_")
        bash(*grep_function(row["files"][tiny_repos.MODULE], name))
        _, wrong = rng.choice(tiny_repos.bugs(name))
        start = buggy.index(tiny_repos.FUNCTIONS[name].split("\n")[0])
        offset, new = next((i, b) for i, (a, b) in enumerate(zip(tiny_repos.FUNCTIONS[name].split("\n"),
                                                                  wrong.split("\n"), strict=True)) if a != b)
        bash(line_fix(start + offset + 1, new), "")
    if agent == GOOD:
        bash(TEST, pytest_output(row, []))
    messages.append({"role": "assistant", "content": None, "tool_calls": [_call(rng, "submit", {})]})
    return {"tools": _tools(), "messages": messages}


def sft_conversations(seed: int, n: int = 1024, shares: dict[str, float] = SHARES) -> list[dict[str, Any]]:
    """``data: [examples.swe_agent:sft_conversations]``: train-split repositories, agents in ``shares``."""
    rng = random.Random(seed)
    rows = tiny_repos.instances(n, "train", "sft", first_seed=SFT_FIRST_SEED + 10_000 * seed)
    agents = rng.choices(list(shares), weights=list(shares.values()), k=n)
    return [conversation(row, agent, rng) for row, agent in zip(rows, agents, strict=True)]


def sft_conversations_4k(seed: int) -> list[dict[str, Any]]:
    """``data: [examples.swe_agent:sft_conversations_4k]``: 4,096 repositories (examples/swe_agent_sft.yaml)."""
    return sft_conversations(seed, 4096)


def sft_heldout(seed: int, n: int = 64) -> list[dict[str, Any]]:
    """``heldout: [examples.swe_agent:sft_heldout]``: the good agent on held-out repositories."""
    rng = random.Random(0)
    return [conversation(row, GOOD, rng) for row in tiny_repos.instances(n, "heldout", "sft")]


def training_rows(seed: int, n: int = 2000) -> list[dict[str, Any]]:
    """``rollout.dataset``: train-split repositories RL draws (not those of the SFT stage)."""
    return tiny_repos.instances(n, "train", tiny_repos.image(), first_seed=RL_FIRST_SEED + 10_000 * seed)


def eval_rows(seed: int, n: int = 64) -> list[dict[str, Any]]:
    """``eval.dataset``: ``n`` held-out repositories, the same for every seed."""
    return tiny_repos.instances(n, "heldout", tiny_repos.image())


if __name__ == "__main__":
    for conv in sft_conversations(int(sys.argv[1]) if len(sys.argv) > 1 else 0):
        print(json.dumps(conv))

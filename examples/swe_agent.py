"""The software-engineering example's data: tiny repositories with a bug, and scripted agents' trajectories.

Tasks: ``envs/repo/tiny_repos.py`` — a one-module repository (``calc.py``: three short
functions), its tests (``test_calc.py``), one bug of the generator's kinds in one function,
graded by hidden tests in a fresh container. They are SWE-bench rows that ``agentrl/Repo-v0``
plays as it plays any: a container per episode (the warm pool), the tools ``bash``,
``str_replace_editor`` and ``submit``, the reward 1 when swebench's grading says resolved.
``ENV_KWARGS`` keep every prompt and observation short for the tiny model's 1,024-token
(byte) context: the prompt is the problem statement alone, the tools' descriptions are a few
words, the editor offers ``str_replace`` alone and answers an edit with the edited line
(``short_edits``), and a command's output is cut past 300 bytes.

The supervised stage (``examples/swe_agent_sft.yaml``) learns from scripted agents' episodes,
their observations as the container gives them: ``GOOD`` runs the tests, reads which test
fails, prints the module, fixes that function with ``str_replace`` and submits; ``BLIND``
fixes the file without running the tests; ``WRONG`` runs the tests and then "fixes" a function
that was not broken; ``RUSHED`` submits at once. An edit's ``old_str`` is the shortest run of
words around the change that occurs once in the module (``short_edit``: ``a - b`` -> ``a + b``,
``x > 9:`` -> ``x < 9:``), so that the model copies a few characters, not a line (the earlier
recipes' ``sed`` of the whole line, regex-escaped, was too much exact copying for it).
``SHARES`` are tuned like the other examples' (a minority of good episodes), so that RL starts
from a model that takes the good path in some samples: room for RL to learn that running the
tests and fixing what they name pays.

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
from envs.repo.editor import numbered

ENV_KWARGS: dict[str, Any] = {"tools": ["bash", "str_replace_editor", "submit"], "prompt": "{instruction}",
                              "max_output": 300, "max_turns": 6, "command_timeout_s": 30.0, "eval_timeout_s": 120.0,
                              "warm": 2, "short_edits": True, "editor_commands": ["str_replace"],
                              "tool_descriptions": {"bash": "Run a command.", "str_replace_editor": "Edit a file.",
                                                    "submit": "Submit."}}
"""``agentrl/Repo-v0``'s arguments here (the configs' ``env_kwargs`` repeat them)."""
TEST = "python3 -m pytest"
GOOD, BLIND, WRONG, RUSHED = "good", "blind", "wrong", "rushed"
SHARES = {RUSHED: 0.55, GOOD: 0.3, BLIND: 0.1, WRONG: 0.05}
"""Shares of the scripted agents in ``sft_conversations`` (the first recipe: greedy, its model submits at once)."""
SHARES_MORE_GOOD = {RUSHED: 0.4, GOOD: 0.45, BLIND: 0.1, WRONG: 0.05}
"""Shares in ``sft_conversations_4k``, the recipe of examples/swe_agent_sft.yaml (benchmarks/RESULTS.md)."""
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


def short_edit(source: str, old_line: str, new_line: str) -> tuple[str, str]:
    """``str_replace``'s (old_str, new_str) turning ``old_line`` of ``source`` into ``new_line``: the
    shortest run of the line's words that covers the change and its operand on each side (never
    the leading ``return`` / ``if``) and occurs once in ``source``; the whole line where none does."""
    old, new = old_line.split(), new_line.split()
    changed = [i for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b] if len(old) == len(new) else []
    if not changed:
        return old_line, new_line
    first = 1 if old[0] in ("return", "if") else 0
    lo, hi = max(first, changed[0] - 1), min(len(old) - 1, changed[-1] + 1)
    spans = sorted(((s, e) for s in range(lo + 1) for e in range(hi, len(old))),
                   key=lambda se: (len(" ".join(old[se[0]:se[1] + 1])), se[0]))
    for s, e in spans:
        if source.count(" ".join(old[s:e + 1])) == 1:
            return " ".join(old[s:e + 1]), " ".join(new[s:e + 1])
    return old_line, new_line


def edit_call(source: str, old_line: str, new_line: str) -> dict[str, str]:
    """``str_replace_editor``'s arguments for that change of ``calc.py`` (``short_edit``)."""
    old, new = short_edit(source, old_line, new_line)
    return {"command": "str_replace", "path": f"/testbed/{tiny_repos.MODULE}", "old_str": old, "new_str": new}


def edit_output(source: str, old_line: str, new_line: str) -> str:
    """What the editor answers that edit with ``short_edits``: the edited line, numbered."""
    old, new = short_edit(source, old_line, new_line)
    after = source.replace(old, new)
    line = source.split(old)[0].count("\n")
    return numbered(after.split("\n")[line], line + 1)


def _call(rng: random.Random, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"call_{rng.randrange(16 ** 8):08x}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def conversation(row: dict[str, Any], agent: str, rng: random.Random) -> dict[str, Any]:
    """One scripted agent's episode on ``row``: its messages, the tool turns as the container answers."""
    buggy, fixed = row["files"][tiny_repos.MODULE].split("\n"), row["fixed"].split("\n")
    line = next(i for i, (a, b) in enumerate(zip(buggy, fixed, strict=True)) if a != b)
    messages: list[dict[str, Any]] = [{"role": "user", "content": tiny_repos.PROBLEM}]

    def act(name: str, arguments: dict[str, Any], output: str) -> None:
        call = _call(rng, name, arguments)
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})

    def bash(command: str, output: str) -> None:
        act("bash", {"command": command}, output)

    def edit(old_line: str, new_line: str) -> None:
        source = row["files"][tiny_repos.MODULE]
        act("str_replace_editor", edit_call(source, old_line, new_line), edit_output(source, old_line, new_line))

    if agent in (GOOD, WRONG):
        bash(TEST, pytest_output(row, [row["function"]]))
    if agent != RUSHED:
        bash(f"cat {tiny_repos.MODULE}", row["files"][tiny_repos.MODULE])
    if agent in (GOOD, BLIND):
        edit(buggy[line], fixed[line])
    if agent == WRONG:  # a line of another function, "fixed" into a bug of its own
        others = [n for n in json.loads(row["PASS_TO_PASS"])]
        name = rng.choice(others).removeprefix("test_calc.py::test_")
        kind, wrong = rng.choice(tiny_repos.bugs(name))
        old, new = next((a, b) for a, b in zip(tiny_repos.FUNCTIONS[name].split("\n"), wrong.split("\n"), strict=True)
                        if a != b)
        edit(old, new)
    messages.append({"role": "assistant", "content": None, "tool_calls": [_call(rng, "submit", {})]})
    return {"tools": _tools(), "messages": messages}


def sft_conversations(seed: int, n: int = 1024, shares: dict[str, float] = SHARES) -> list[dict[str, Any]]:
    """``data: [examples.swe_agent:sft_conversations]``: train-split repositories, agents in ``shares``."""
    rng = random.Random(seed)
    rows = tiny_repos.instances(n, "train", "sft", first_seed=SFT_FIRST_SEED + 10_000 * seed)
    agents = rng.choices(list(shares), weights=list(shares.values()), k=n)
    return [conversation(row, agent, rng) for row, agent in zip(rows, agents, strict=True)]


def sft_conversations_4k(seed: int) -> list[dict[str, Any]]:
    """``data: [examples.swe_agent:sft_conversations_4k]``: 4,096 repositories, ``SHARES_MORE_GOOD``."""
    return sft_conversations(seed, 4096, SHARES_MORE_GOOD)


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

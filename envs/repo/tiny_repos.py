"""Tiny repositories: generated one-module Python repositories with one bug each, as SWE-bench rows.

What it is: the repository task family a 1M-parameter model can learn (``examples/swe_agent.py``).
A repository is ``calc.py`` (three short functions drawn by the seed from ``FUNCTIONS``),
``test_calc.py`` (two asserts per function, their inputs drawn by the seed) and ``pytest.ini``
(terse output: ``-q --tb=no -rf``). One function gets one bug of the generator's kinds:
``swesmith``'s own procedural modifiers where they apply to code this small (operator changed,
constant off by one, operands swapped; applied with their minimum complexity lowered to 1), and
a comparison flipped (``<`` and ``>``, ``<=`` and ``>=``, ``==`` and ``!=``) written here, which
swesmith's Python set lacks. Only one-line bugs are kept, and only when the function's visible
test *and* its hidden test fail on it (the functions are pure: the tests are evaluated here, in
process, exactly as their asserts read).

A row is a SWE-bench instance that ``agentrl/Repo-v0`` plays unchanged: every instance shares
one image (``image()``: Python and pytest, an empty ``/testbed``) and carries its repository in
``files`` (written and committed when the container is handed out; ``base_commit`` is that
commit, computed here with the same script). The hidden tests are the ``test_patch`` (four
asserts per function: the visible two and two more), applied by the ``eval_script`` in the
grading's fresh container; ``FAIL_TO_PASS`` is the buggy function's test, ``PASS_TO_PASS`` the
others'. The gold ``patch`` is the bug's reverse. Split: by the set of functions in the module
(a hash of it): held-out repositories combine functions in ways RL never saw.

Deterministic: ``instance(seed)`` is a pure function of the seed. What it is not: generation from
a real repository (``envs/repo/generate.py``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import re
import tempfile
from pathlib import Path
from typing import Any

from agentrl.errors import EnvError
from envs.repo.generate import reverse_patch
from envs.repo.mutate import _swesmith

MODULE, TESTS = "calc.py", "test_calc.py"
PYTEST_INI = "[pytest]\naddopts = -q --tb=no -rf -p no:cacheprovider\nconsole_output_style = classic\n"
PROBLEM = "A test of calc.py fails. Fix the bug."
IMAGE_NAME = "swe-tiny"
FUNCTIONS = {  # name -> source; each name says what the function does, so a bug is visible to a reader
    "add": "def add(a, b):\n    return a + b\n", "sub": "def sub(a, b):\n    return a - b\n",
    "mul": "def mul(a, b):\n    return a * b\n", "inc": "def inc(x):\n    return x + 1\n",
    "dec": "def dec(x):\n    return x - 1\n", "double": "def double(x):\n    return x * 2\n",
    "triple": "def triple(x):\n    return x * 3\n", "half": "def half(x):\n    return x // 2\n",
    "square": "def square(x):\n    return x * x\n", "last_digit": "def last_digit(x):\n    return x % 10\n",
    "is_even": "def is_even(x):\n    return x % 2 == 0\n", "is_pos": "def is_pos(x):\n    return x > 0\n",
    "is_neg": "def is_neg(x):\n    return x < 0\n", "is_big": "def is_big(x):\n    return x >= 10\n",
    "clip": "def clip(x):\n    if x > 9:\n        return 9\n    return x\n",
    "max2": "def max2(a, b):\n    if a > b:\n        return a\n    return b\n",
    "min2": "def min2(a, b):\n    if a < b:\n        return a\n    return b\n",
    "absval": "def absval(x):\n    if x < 0:\n        return -x\n    return x\n",
    "avg2": "def avg2(a, b):\n    return (a + b) // 2\n", "is_zero": "def is_zero(x):\n    return x == 0\n",
}
SWESMITH_KINDS = ("func_pm_op_change", "func_pm_op_change_const", "func_pm_op_swap")
FLIPS = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "==": "!=", "!=": "=="}
HELDOUT_SHARE = 0.25
GIT_EPOCH = 1733011200  # task_image.GIT_ENV's dates, 2024-12-01T00:00:00Z


def _arity(name: str) -> int:
    return FUNCTIONS[name].split("\n")[0].count(",") + 1


def _call(name: str, args: tuple[int, ...]) -> str:
    return f"{name}({', '.join(map(str, args))})"


def test_source(names: list[str], inputs: dict[str, list[tuple[int, ...]]], source: str) -> str:
    """The test file: per function, ``assert f(args) == value`` with the values of ``source``."""
    scope: dict[str, Any] = {}
    exec(source, scope)  # noqa: S102 - our own generated module of pure functions
    lines = [f"from calc import {', '.join(sorted(names))}", ""]
    for name in names:
        lines += ["", f"def test_{name}():"]
        lines += [f"    assert {_call(name, args)} == {scope[name](*args)!r}" for args in inputs[name]]
    return "\n".join(lines) + "\n"


def _fails(source: str, name: str, inputs: list[tuple[int, ...]], expected: dict[str, Any]) -> bool:
    scope: dict[str, Any] = {}
    try:
        exec(source, scope)  # noqa: S102 - the buggy module: pure arithmetic
        return any(scope[name](*args) != expected[_call(name, args)] for args in inputs)
    except Exception:  # noqa: BLE001 - an error is a failing test too
        return True


@functools.cache
def bugs(name: str) -> tuple[tuple[str, str], ...]:
    """(kind, buggy source) of every one-line bug of ``FUNCTIONS[name]`` (see the module docstring)."""
    source = FUNCTIONS[name]
    get_entities, modifiers, apply_change = _swesmith()
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="agentrl-tiny-") as tmp:
        path = Path(tmp) / MODULE
        path.write_text(source)
        entities: list[Any] = []
        get_entities(entities, str(path))
        for entity in entities:
            for proto in (m for m in modifiers if m.name in SWESMITH_KINDS):
                for trial in range(3):
                    seed = int.from_bytes(hashlib.sha256(f"{name}/{proto.name}/{trial}".encode()).digest()[:4], "big")
                    modifier = type(proto)(likelihood=1.0, seed=seed)
                    modifier.min_complexity = 1
                    if not modifier.can_change(entity) or (bug := modifier.modify(entity)) is None:
                        continue
                    path.write_text(source)
                    apply_change(entity, bug)
                    out.setdefault(path.read_text(), proto.name)
    lines = source.split("\n")
    for i, line in enumerate(lines):
        for m in re.finditer(r" (<=|>=|==|!=|<|>) ", line):
            flipped = line[:m.start(1)] + FLIPS[m.group(1)] + line[m.end(1):]
            out.setdefault("\n".join(lines[:i] + [flipped] + lines[i + 1:]), "flip_comparison")
    one_line = {text: kind for text, kind in out.items() if len(text.split("\n")) == len(lines)
                and sum(a != b for a, b in zip(text.split("\n"), lines, strict=True)) == 1}
    return tuple(sorted(((kind, text) for text, kind in one_line.items()), key=lambda kt: kt[1]))


def files_commit(files: dict[str, str]) -> str:
    """The commit ``FILES_COMMIT`` makes of ``files`` in a container (the row's ``base_commit``),
    computed as git hashes objects: blobs, one flat tree, a commit by ``GIT_ENV``'s author and date."""
    if any("/" in rel for rel in files):
        raise EnvError(f"a tiny repository's files are flat, got {sorted(files)}")

    def obj(kind: str, body: bytes) -> bytes:
        return hashlib.sha1(f"{kind} {len(body)}".encode() + b"\0" + body).digest()  # noqa: S324 - git's own hash

    tree = b"".join(b"100644 " + rel.encode() + b"\0" + obj("blob", files[rel].encode()) for rel in sorted(files))
    who = f"agentrl <agentrl@localhost> {GIT_EPOCH} +0000"
    commit = f"tree {obj('tree', tree).hex()}\nauthor {who}\ncommitter {who}\n\nthe task files\n".encode()
    return obj("commit", commit).hex()


def eval_script(base_commit: str, test_patch: str) -> str:
    """swebench 5.x's eval script: the test file as at ``base_commit``, the hidden tests applied, pytest -rA."""
    return "\n".join([
        "#!/bin/bash", "set -uxo pipefail", "cd /testbed", "git config --global --add safe.directory /testbed",
        f"git checkout {base_commit} -- {TESTS}", "git apply -v - <<'EOF_114329324912'", test_patch.rstrip("\n"),
        "EOF_114329324912", ": '>>>>> Start Test Output'", f"python3 -m pytest -rA {TESTS}",
        ": '>>>>> End Test Output'", f"git checkout {base_commit} -- {TESTS}", ""])


def split_of(names: list[str]) -> str:
    """``train`` or ``heldout``, by the module's set of functions."""
    digest = hashlib.sha256(",".join(sorted(names)).encode()).digest()
    return "heldout" if digest[0] < 256 * HELDOUT_SHARE else "train"


def instance(seed: int, image_tag: str) -> dict[str, Any] | None:
    """The SWE-bench row of repository ``seed`` (None when its draw has no bug that both tests catch)."""
    rng = random.Random(seed)
    names = rng.sample(sorted(FUNCTIONS), 3)
    source = "\n\n".join(FUNCTIONS[n] for n in names)
    shown = {n: [tuple(rng.randint(-12, 12) for _ in range(_arity(n))) for _ in range(2)] for n in names}
    hidden = {n: shown[n] + [tuple(rng.randint(-12, 12) for _ in range(_arity(n))) for _ in range(2)] for n in names}
    scope: dict[str, Any] = {}
    exec(source, scope)  # noqa: S102 - our own module
    expected = {_call(n, args): scope[n](*args) for n in names for args in hidden[n]}
    caught = []
    for owner in names:
        for kind, wrong in bugs(owner):
            buggy = source.replace(FUNCTIONS[owner], wrong)
            changed = next(b for a, b in zip(FUNCTIONS[owner].split("\n"), wrong.split("\n"), strict=True) if a != b)
            if buggy.split("\n").count(changed) == 1 and _fails(buggy, owner, shown[owner], expected) \
                    and _fails(buggy, owner, hidden[owner], expected):
                caught.append((kind, buggy, owner))
    if not caught:
        return None
    kind, buggy, owner = rng.choice(caught)
    visible, secret = test_source(names, shown, source), test_source(names, hidden, source)
    files = {MODULE: buggy, TESTS: visible, "pytest.ini": PYTEST_INI}
    base = files_commit(files)
    test_patch = reverse_patch(TESTS, visible, secret)
    return {"instance_id": f"tiny__{seed}", "repo": "tiny", "version": "", "base_commit": base,
            "problem_statement": PROBLEM, "hints_text": "", "patch": reverse_patch(MODULE, buggy, source),
            "test_patch": test_patch, "FAIL_TO_PASS": json.dumps([f"{TESTS}::test_{owner}"]),
            "PASS_TO_PASS": json.dumps([f"{TESTS}::test_{n}" for n in names if n != owner]), "image": image_tag,
            "eval_script": eval_script(base, test_patch), "log_parser": "parse_log_pytest",
            "eval_type": "pass_and_fail", "files": files, "split": split_of(names), "strategy": kind,
            "function": owner, "fixed": source}


def instances(n: int, split: str, image_tag: str, first_seed: int = 0) -> list[dict[str, Any]]:
    """The first ``n`` rows of ``split`` (train / heldout) from repository seeds ``first_seed``, ``first_seed+1``, ..."""
    if split not in ("train", "heldout"):
        raise EnvError(f"split must be 'train' or 'heldout', got {split!r}")
    rows: list[dict[str, Any]] = []
    seed = first_seed
    while len(rows) < n:
        if seed - first_seed > 50 * n + 1000:
            raise EnvError(f"only {len(rows)} {split} repositories among seeds {first_seed}..{seed}")
        row = instance(seed, image_tag) if split_of(rng_names(seed)) == split else None
        if row is not None:
            rows.append(row)
        seed += 1
    return rows


def rng_names(seed: int) -> list[str]:
    """The functions repository ``seed`` draws (the first draw of ``instance``)."""
    return random.Random(seed).sample(sorted(FUNCTIONS), 3)


def image() -> str:
    """The one image every tiny repository runs in: the sandbox image, git, pytest, an empty ``/testbed``
    (``task_image.repo_image``: built once, offline from wheels pip fetched; cached by its recipe)."""
    from envs.repo.task_image import repo_image

    with tempfile.TemporaryDirectory(prefix="agentrl-tiny-image-") as tmp:
        return repo_image(Path(tmp), IMAGE_NAME)

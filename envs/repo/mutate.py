"""Bug candidates for a Python repository: swesmith's procedural rewrites, one small change each.

What it is: the candidate side of task generation (``envs/repo/generate.py``). The
repository's source files (not its tests) are read with ``swesmith``'s own Python adapter
(``get_entities_from_file_py``: its functions and classes), and each (entity, rewrite) pair
that ``swesmith``'s procedural modifier accepts (``MODIFIERS_PYTHON``: operator changed or
swapped, constants changed, a conditional / loop / assignment / wrapper removed, if-else
inverted, lines shuffled, class bases or methods removed...) is one candidate. The modifier is
applied with swesmith's ``apply_code_change`` on a scratch copy of the file, so a candidate is
the whole buggy file. Nothing of swesmith is re-implemented, and it needs no network here: its
cloning is the only part of its pipeline that does, and it is not used.

Deterministic: each modifier is seeded from (seed, file, line, rewrite), and the pairs are
shuffled with ``random.Random(seed)``: the same repository and seed give the same list.

What it is not: running tests or keeping candidates (``envs/repo/generate.py``).
"""

from __future__ import annotations

import hashlib
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.errors import EnvError

SKIP_DIRS = {".git", ".tox", ".nox", "build", "dist", "docs", "doc", "examples", "benchmarks", "tests", "test",
             "testing", "__pycache__", ".venv", "venv", "scripts", "tools"}


@dataclass(frozen=True)
class Candidate:
    """One rewrite of one function or class: ``path``'s whole text, buggy and as it was."""

    path: str  # relative to the repository root
    entity: str
    line_start: int
    strategy: str  # swesmith's modifier name, e.g. func_pm_op_change
    explanation: str
    buggy: str
    fixed: str  # the file as it is in the repository

    @property
    def module(self) -> str:
        """The dotted module the bug is in (the train / held-out split is by this)."""
        parts = Path(self.path).with_suffix("").parts
        parts = parts[1:] if parts[0] == "src" else parts
        return ".".join(p for p in parts if p != "__init__") or parts[0]


def _swesmith() -> Any:
    try:
        from swesmith.bug_gen.adapters.python import get_entities_from_file_py
        from swesmith.bug_gen.procedural.python import MODIFIERS_PYTHON
        from swesmith.bug_gen.utils import apply_code_change
    except ImportError as e:
        raise EnvError("generating tasks needs swesmith 0.0.9 (pip install 'agentrl[repo]')") from e
    return get_entities_from_file_py, MODIFIERS_PYTHON, apply_code_change


def is_test_file(rel: Path) -> bool:
    name = rel.name
    return name.startswith("test") or name.endswith("_test.py") or name == "conftest.py"


def source_files(repo: Path, include: tuple[str, ...] = ()) -> list[Path]:
    """The repository's Python source files (relative), tests, setup and docs left out;
    ``include``: only paths starting with one of these."""
    files = []
    for path in sorted(repo.rglob("*.py")):
        rel = path.relative_to(repo)
        if any(part in SKIP_DIRS for part in rel.parts[:-1]) or is_test_file(rel) or rel.name in {"setup.py", "noxfile.py"}:
            continue
        if include and not any(str(rel).startswith(prefix) for prefix in include):
            continue
        files.append(rel)
    return files


def _seed_of(seed: int, *parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr((seed, *parts)).encode()).digest()[:8], "big")


def candidates(repo: Path, seed: int, include: tuple[str, ...] = (), limit: int = 0) -> list[Candidate]:
    """Up to ``limit`` (0: all) candidates of ``repo``, in a seeded order (see the module docstring)."""
    get_entities, modifiers, apply_change = _swesmith()
    pairs: list[tuple[Path, Any, Any]] = []
    for rel in source_files(repo, include):
        entities: list[Any] = []
        get_entities(entities, str(repo / rel))
        for entity in sorted(entities, key=lambda e: (e.line_start, e.line_end)):
            pairs += [(rel, entity, type(m)) for m in modifiers if m.can_change(entity)]
    random.Random(seed).shuffle(pairs)
    out: list[Candidate] = []
    seen: set[tuple[str, str]] = set()
    with tempfile.TemporaryDirectory(prefix="agentrl-mutate-") as tmp:
        for rel, entity, kind in pairs:
            if limit and len(out) >= limit:
                break
            modifier = kind(likelihood=_likelihood(modifiers, kind), seed=_seed_of(seed, str(rel), entity.line_start, kind.name))
            bug = modifier.modify(entity)
            if bug is None:
                continue
            scratch = Path(tmp) / "file.py"
            original = (repo / rel).read_text(encoding="utf-8")
            scratch.write_text(original, encoding="utf-8")
            entity.file_path = str(scratch)
            try:
                apply_change(entity, bug)
            finally:
                entity.file_path = str(repo / rel)
            buggy = scratch.read_text(encoding="utf-8")
            if buggy == original or (str(rel), buggy) in seen or not _compiles(buggy):
                continue
            seen.add((str(rel), buggy))
            out.append(Candidate(str(rel), entity.name, entity.line_start, kind.name, bug.explanation, buggy, original))
    return out


def _likelihood(modifiers: list[Any], kind: type) -> float:
    return next(m.likelihood for m in modifiers if type(m) is kind)


def _compiles(source: str) -> bool:
    try:
        compile(source, "<candidate>", "exec")
        return True
    except (SyntaxError, ValueError):
        return False


def copy_source(src: Path, dest: Path) -> None:
    """``src``'s tree without VCS folders or caches (the repository's history is not kept)."""
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns(".git", ".hg", "__pycache__", "*.pyc", ".tox", ".nox",
                                                             ".pytest_cache", "*.egg-info", ".venv*"))

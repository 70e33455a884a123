"""The maps of the code stay true: each package's ``__init__`` docstring, the one layout in
docs/DESIGN.md §2, and the one-screen rule for functions.

A package map is the block of lines in a package's ``__init__`` docstring that each start with a
module (``name.py``) or a folder (``name/``); it names every module and folder of the package and
nothing else. The layout in DESIGN.md §2 names, under each package's entry, the same modules and
folders. Both fail here the moment a module is added, moved or removed without them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = ("agentrl", "envs", "sandboxes", "workflows")
ENTRY = re.compile(r"^[ \t]*([A-Za-z_]\w*\.py|[A-Za-z_]\w*/)(?=[ \t]|$)", re.M)
"""A map line: one that starts with ``name.py`` or ``name/``."""
MENTION = re.compile(r"(?<![\w/<>.-])([A-Za-z_]\w*\.py)\b")
"""A module named anywhere in the text by its bare file name (``a/b.py`` is a path, not counted)."""


def packages() -> list[Path]:
    return sorted(p.parent for top in TOP for p in (ROOT / top).rglob("__init__.py"))


def members(package: Path) -> set[str]:
    """The package's modules and its folders (subpackages, or data and worker folders)."""
    files = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    folders = {f"{d.name}/" for d in package.iterdir() if d.is_dir() and d.name != "__pycache__"}
    return files | folders


def docstring(package: Path) -> str:
    return ast.get_docstring(ast.parse((package / "__init__.py").read_text()), clean=False) or ""


@pytest.mark.parametrize("package", packages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_package_map_names_every_module_and_nothing_else(package):
    doc = docstring(package)
    mapped, have = set(ENTRY.findall(doc)), members(package)
    where = f"{package.relative_to(ROOT)}/__init__.py"
    assert not mapped - have, f"{where}'s map names what is not in the package: {sorted(mapped - have)}"
    assert not have - mapped, f"{where}'s map lacks {sorted(have - mapped)} (a line each: the name, what it is)"
    stray = set(MENTION.findall(doc)) - have
    assert not stray, f"{where} names modules it does not hold: {sorted(stray)}"


def design_layout() -> str:
    text = (ROOT / "docs" / "DESIGN.md").read_text()
    section = text[text.index("\n## 2. "):]
    return re.search(r"```\n(.*?)```", section, re.DOTALL).group(1)


def layout_sections(layout: str) -> dict[str, str]:
    """The layout's own text of each package, by its path (``agentrl``, ``agentrl/client``, ``envs``):
    from its ``name/`` line to the next entry (a line naming a module or folder) at its indentation
    or less, less the text of the packages nested in it."""
    lines = layout.splitlines()
    entries = [(i, len(m.group(1)), m.group(2)) for i, line in enumerate(lines)
               if (m := re.match(r"^( *)([A-Za-z_][\w.-]*/|[A-Za-z_]\w*\.py)(?=\s|$)", line))
               and len(m.group(1)) in (0, 2)]
    spans, top = {}, ""
    for n, (i, indent, name) in enumerate(entries):
        if name.endswith("/"):
            top = name[:-1] if indent == 0 else top
            path = top if indent == 0 else f"{top}/{name[:-1]}"
            spans[path] = (i, next((j for j, d, _ in entries[n + 1:] if d <= indent), len(lines)))
    return {path: "\n".join(line for k, line in enumerate(lines[a:b], a)
                             if not any(a < c <= k < d for other, (c, d) in spans.items() if other != path))
            for path, (a, b) in spans.items()}


@pytest.mark.parametrize("package", [p for p in packages() if p.parent.name != "envs"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_design_layout_names_every_module_and_nothing_else(package):
    """DESIGN.md §2 is the one layout description: each package's entry names its modules and
    folders (envs' task families, which are packages of their own, are named as folders)."""
    path = str(package.relative_to(ROOT))
    sections = layout_sections(design_layout())
    assert path in sections, f"docs/DESIGN.md §2 has no entry for {path}/"
    named = set(re.findall(r"(?<![\w/<>.-])([A-Za-z_]\w*\.py|[A-Za-z_]\w*/)(?![\w.])", sections[path]))
    named.discard(f"{package.name}/")
    named |= {f"{other.rsplit('/', 1)[1]}/" for other in sections if other.rpartition("/")[0] == path}  # own entries
    have = members(package)
    assert not named - have, f"docs/DESIGN.md §2 names under {path}/ what is not there: {sorted(named - have)}"
    assert not have - named, f"docs/DESIGN.md §2's entry for {path}/ lacks {sorted(have - named)}"


SPLIT_ELSEWHERE = {
}
"""Functions another branch of #43 splits; the lead empties this set when they merge."""
MAX_LINES = 100


def long_functions() -> dict[str, int]:
    found = {}
    for path in sorted((ROOT / "agentrl").rglob("*.py")):
        def walk(node, prefix, path=path):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    name = f"{prefix}{child.name}"
                    lines = child.end_lineno - child.lineno + 1
                    if not isinstance(child, ast.ClassDef) and lines > MAX_LINES:
                        found[f"{path.relative_to(ROOT)}::{name}"] = lines
                    walk(child, f"{name}.")
        walk(ast.parse(path.read_text()), "")
    return found


def test_no_function_in_agentrl_is_over_a_screen():
    found = long_functions()
    long = {name: n for name, n in found.items() if name not in SPLIT_ELSEWHERE}
    assert long == {}, (f"functions over {MAX_LINES} lines: {long}; split them by phase or route group, "
                        "each readable on one screen")
    gone = sorted(name for name in SPLIT_ELSEWHERE if name not in found)
    assert gone == [], f"split already: take {gone} out of SPLIT_ELSEWHERE"

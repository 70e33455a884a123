"""Quality gates: lint and the dependency direction of DESIGN.md §2 are part of the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(*cmd):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_is_clean():
    r = run(str(BIN / "ruff"), "check", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_import_contracts_hold():
    r = run(str(BIN / "lint-imports"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def test_api_imports_no_heavy_packages():
    code = "import sys, agentrl.api; bad = {'torch', 'httpx', 'transformers'} & set(sys.modules); print(sorted(bad))"
    r = run(sys.executable, "-c", code)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


IMPORT_NAMES = {"pyyaml": "yaml", "math-verify": "math_verify", "tensorboard": r"torch\.utils\.tensorboard",
                "httptools": "uvicorn"}  # uvicorn's HTTP parser (launch.services.HTTP_PARSER)
"""Requirement name -> the module (a regex) whose import uses it."""


def test_every_base_requirement_is_imported_by_the_base_install():
    """pyproject's base dependencies are what the installed packages import; the rest are extras."""
    import re
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.split(r"[<>=!~\[ ]", d, maxsplit=1)[0].lower() for d in deps]
    code = "\n".join(p.read_text() for pkg in ("agentrl", "envs", "sandboxes", "workflows")
                     for p in (ROOT / pkg).rglob("*.py"))
    unused = [n for n in names
              if not re.search(rf"^\s*(import|from) {IMPORT_NAMES.get(n, n.replace('-', '_'))}\b", code, re.M)]
    assert not unused, f"base requirements nothing in the base install imports: {unused}; make them extras"


def test_a_missing_extra_is_one_line_naming_it():
    from agentrl.errors import ConfigError
    from agentrl.plugins import import_optional

    with pytest.raises(ConfigError, match=r"pip install 'agentrl\[plots\]'"):
        import_optional("agentrl_no_such_package", extra="plots", purpose="a plot")
    assert import_optional("json", extra="none", purpose="x").dumps([1]) == "[1]"


def test_no_import_cycle_in_the_core():
    """No module of agentrl/ imports (directly or not) a module that imports it back."""
    import grimp

    graph = grimp.build_graph("agentrl")
    cycles = [(a, b) for a in sorted(graph.modules) for b in graph.find_modules_directly_imported_by(a)
              if b != a and graph.chain_exists(importer=b, imported=a)]
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_no_two_modules_of_the_core_share_a_file_name():
    """A name is a promise of location: ``gateway.py`` is one file, found at the first guess."""
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "agentrl").rglob("*.py")):
        if path.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}

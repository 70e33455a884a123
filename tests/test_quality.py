"""Quality gates: lint and the dependency direction of DESIGN.md §2 are part of the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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

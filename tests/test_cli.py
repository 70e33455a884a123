"""The CLI as a user types it: a real subprocess of the installed console script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

AGENTRL = str(Path(sys.executable).parent / "agentrl")


def test_help_lists_subcommands_and_each_has_help():
    r = subprocess.run([AGENTRL, "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    block = r.stdout.split("  COMMAND\n", 1)[1].split("\n\n", 1)[0]
    listed = [line.split()[0] for line in block.splitlines() if line.startswith("    ") and line.split()]
    assert {"model", "serve", "sandbox", "envs"} <= set(listed), r.stdout
    for name in listed:
        sub = subprocess.run([AGENTRL, name, "--help"], capture_output=True, text=True, timeout=120)
        assert sub.returncode == 0 and "usage: agentrl" in sub.stdout, (name, sub.stderr)


def test_no_subcommand_prints_help_and_fails():
    r = subprocess.run([AGENTRL], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "usage: agentrl" in r.stdout

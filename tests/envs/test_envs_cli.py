"""`agentrl envs` as a user types it: a real subprocess of the console script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

AGENTRL = str(Path(sys.executable).parent / "agentrl")


def agentrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([AGENTRL, *args], capture_output=True, text=True, timeout=300)


def test_list_prints_one_line_per_env():
    r = agentrl("envs")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["agentrl/Arith-v0", "agentrl/ArithRetry-v0", "agentrl/Code-v0", "agentrl/CodeAgent-v0",
                                                   "agentrl/Math-v1", "agentrl/MathRetry-v1", "agentrl/ToolUse-v0"]
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

"""A generated SWE-bench instance written as a Harbor task directory (Terminal-Bench 2.0 format).

What it is: the second output of ``envs/repo/generate.py``. The directory holds
``instruction.md`` (the problem statement), ``task.toml`` (the instance's image, no network),
``tests/test.sh`` (the verifier: the repository's test files restored from the base commit,
then the instance's FAIL_TO_PASS and PASS_TO_PASS tests by node id; reward 1 when they all
pass) with ``tests/tests.txt`` (those ids), and ``solution/solve.sh`` (the gold patch).

What it is not: a reader of the format (``envs/repo/tasks.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TASK_TOML = """version = "1.0"

[metadata]
difficulty = "easy"
category = "debugging"
tags = ["python", "generated", "{repo}"]

[verifier]
timeout_sec = 600.0

[agent]
timeout_sec = 1800.0

[environment]
docker_image = "{image}"
cpus = 1
memory = "2G"
storage = "4G"
allow_internet = false
"""
TEST_SH = """#!/bin/bash
# Harbor's verifier: the test files as at the base commit, then the instance's tests; reward in /logs/verifier.
cd /testbed
mkdir -p /logs/verifier
git -c safe.directory=/testbed checkout {base} -- {files}
mapfile -t ids < /tests/tests.txt
if python3 -m pytest -q -p no:cacheprovider "${{ids[@]}}"; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
"""


def write_task(task: Path, row: dict[str, Any]) -> None:
    """``row`` (a generated instance) as the Harbor task directory ``task``."""
    (task / "tests").mkdir(parents=True, exist_ok=True)
    (task / "solution").mkdir(exist_ok=True)
    (task / "instruction.md").write_text(row["problem_statement"] + "\nThe repository is at /testbed.\n")
    (task / "task.toml").write_text(TASK_TOML.format(repo=row["repo"], image=row["image"]))
    files = " ".join(sorted({t.split("::", 1)[0] for t in json.loads(row["FAIL_TO_PASS"]) + json.loads(row["PASS_TO_PASS"])}))
    (task / "tests" / "test.sh").write_text(TEST_SH.format(base=row["base_commit"], files=files))
    ids = json.loads(row["FAIL_TO_PASS"]) + json.loads(row["PASS_TO_PASS"])
    (task / "tests" / "tests.txt").write_text("".join(f"{i}\n" for i in ids))
    (task / "solution" / "solve.sh").write_text(
        "#!/bin/bash\nset -euo pipefail\ncd /testbed\ngit apply - <<'EOF_PATCH'\n" + row["patch"] + "EOF_PATCH\n")

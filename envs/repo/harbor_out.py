"""A generated SWE-bench instance written as a Harbor task directory (Terminal-Bench 2.0 format).

What it is: the second output of ``envs/repo/generate.py``. The directory holds
``instruction.md`` (the problem statement), ``task.toml`` (the instance's image, no network),
``tests/test.sh`` (the verifier: the repository's test files restored from the base commit,
run with ``pytest -rA``; reward 1 when every FAIL_TO_PASS and PASS_TO_PASS test, named as swebench's
``parse_log_pytest`` names them, passed) with ``tests/tests.txt`` (those ids), and ``solution/solve.sh`` (the gold patch).

What it is not: a reader of the format (``envs/repo/tasks.py``).
"""

from __future__ import annotations

import json
import re
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
# Harbor's verifier: the test files as at the base commit, run with pytest -rA; reward 1 when every test
# of tests.txt (named as swebench's parse_log_pytest names them) passed; in /logs/verifier.
cd /testbed
mkdir -p /logs/verifier
git -c safe.directory=/testbed checkout {base} -- {files}
COLUMNS=200 python3 -m pytest -rA -p no:cacheprovider {files} > /logs/verifier/pytest.log 2>&1
python3 - <<'EOF_VERIFY'
passed = set()
for line in open("/logs/verifier/pytest.log", errors="replace"):
    words = line.split()
    if len(words) > 1 and words[0] == "PASSED":
        passed.add(words[1])
wanted = [t for t in open("/tests/tests.txt").read().splitlines() if t]
missing = [t for t in wanted if t not in passed]
print(f"{{len(wanted) - len(missing)}} of {{len(wanted)}} tests passed", *missing[:20], sep="\\n")
open("/logs/verifier/reward.txt", "w").write("1\\n" if wanted and not missing else "0\\n")
EOF_VERIFY
"""


def write_task(task: Path, row: dict[str, Any]) -> None:
    """``row`` (a generated instance) as the Harbor task directory ``task``."""
    (task / "tests").mkdir(parents=True, exist_ok=True)
    (task / "solution").mkdir(exist_ok=True)
    (task / "instruction.md").write_text(row["problem_statement"] + "\nThe repository is at /testbed.\n")
    (task / "task.toml").write_text(TASK_TOML.format(repo=row["repo"], image=row["image"]))
    files = re.search(r"pytest -rA -p no:cacheprovider (.*)", row["eval_script"]).group(1)  # the test files
    (task / "tests" / "test.sh").write_text(TEST_SH.format(base=row["base_commit"], files=files))
    ids = json.loads(row["FAIL_TO_PASS"]) + json.loads(row["PASS_TO_PASS"])
    (task / "tests" / "tests.txt").write_text("".join(f"{i}\n" for i in ids))
    (task / "solution" / "solve.sh").write_text(
        "#!/bin/bash\nset -euo pipefail\ncd /testbed\ngit apply - <<'EOF_PATCH'\n" + row["patch"] + "EOF_PATCH\n")

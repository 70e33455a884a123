"""Build the repository-task test fixtures: one task image and the two task formats over it.

    python3 docker/repo-task/build.py            # prints the folder with the tasks (built once, cached)

What it makes, from a real package not written here (``six`` 1.17.0, its sdist from PyPI, whose
``test_six.py`` is its own pytest suite) and a small bug put into it:

  * the image ``agentrl-repo-six:<recipe hash>``, FROM the offline sandbox image
    (``make sandbox-image``) with git and patch (apt, the machine's Debian mirror) and pytest
    (wheels the host's pip downloaded): the repository at ``/testbed``, a fresh git history of
    one commit (the base commit: the bug in, the test that catches it out), nothing of the fix;
  * ``instances.jsonl``: that task as one SWE-bench 5.x row (``patch`` fixes the bug,
    ``test_patch`` brings the test back, ``eval_script`` in swebench's shape, ``log_parser``
    ``parse_log_pytest``);
  * ``harbor/six-ensure-text/``: the same task as a Harbor (Terminal-Bench 2.0) task directory.

Cached: everything lives under ``$AGENTRL_CACHE/repo-tasks/<recipe hash>`` (the hash of this
file), and the image is tagged with the hash; a second run prints the folder and does nothing.
Standard library only; needs the docker CLI, git, and pip (this interpreter's) reaching PyPI.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SIX = "six==1.17.0"
PYTEST = "pytest==8.3.5"
BASE_IMAGE = os.environ.get("AGENTRL_SANDBOX_IMAGE", "agentrl-sandbox:latest")
RECIPE = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
IMAGE = f"agentrl-repo-six:{RECIPE}"
INSTANCE_ID = "benjaminp__six-1"
TEST_FILE = "test_six.py"
F2P = ["test_six.py::test_ensure_text_decodes_with_encoding"]
P2P = ["test_six.py::test_add_doc", "test_six.py::test_lazy", "test_six.py::test_b", "test_six.py::test_u",
       "test_six.py::test_wraps"]
NEW_TEST = '''

def test_ensure_text_decodes_with_encoding():
    emoji = six.u("\\U0001F600")
    assert six.ensure_text(emoji.encode("utf-8"), encoding="utf-8") == emoji
    assert six.ensure_text(emoji.encode("utf-16"), encoding="utf-16") == emoji
    assert six.ensure_text(b"caf\\xe9", encoding="latin-1") == six.u("caf\\xe9")
    assert six.ensure_text(emoji) == emoji
'''
FIXED = "    if isinstance(s, binary_type):\n        return s.decode(encoding, errors)\n    elif isinstance(s, text_type):"
BUGGY = "    if isinstance(s, binary_type):\n        return s.decode('latin-1', errors)\n    elif isinstance(s, text_type):"
PROBLEM = """six.ensure_text ignores its encoding for bytes

`six.ensure_text(b"\\xf0\\x9f\\x98\\x80", encoding="utf-8")` should return the grinning face
emoji, but it returns `'Ã°\\x9f\\x98\\x80'`: the bytes are not decoded with the encoding given.
`six.ensure_str` does this right. Fix `ensure_text` so that bytes are decoded with `encoding`
and `errors`.
"""
GIT_ENV = {"GIT_AUTHOR_NAME": "agentrl", "GIT_AUTHOR_EMAIL": "agentrl@localhost", "GIT_AUTHOR_DATE": "2024-12-01T00:00:00Z",
           "GIT_COMMITTER_NAME": "agentrl", "GIT_COMMITTER_EMAIL": "agentrl@localhost",
           "GIT_COMMITTER_DATE": "2024-12-01T00:00:00Z", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
DOCKERFILE = """FROM {base}
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends git patch \\
    >/dev/null && rm -rf /var/lib/apt/lists/*
COPY wheels /tmp/wheels
RUN site=$(python3 -c 'import site; print(site.getsitepackages()[0])') && mkdir -p "$site" \\
 && for w in /tmp/wheels/*.whl; do python3 -m zipfile -e "$w" "$site"; done && rm -rf /tmp/wheels
COPY testbed /testbed
WORKDIR /testbed
LABEL agentrl.repo.recipe={recipe}
"""


def run(*cmd: str, cwd: Path | None = None, env: dict | None = None) -> str:
    out = subprocess.run(cmd, cwd=cwd, env={**os.environ, **(env or {})}, check=True, capture_output=True, text=True)
    return out.stdout


def git(repo: Path, *args: str) -> str:
    return run("git", *args, cwd=repo, env=GIT_ENV)


def make_repo(work: Path) -> tuple[Path, dict[str, str]]:
    """The repository at its base commit, and the gold and test patches against it."""
    run(sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", SIX, "-d", str(work / "sdist"))
    sdist = next((work / "sdist").glob("six-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        tar.extractall(work / "src", filter="data")
    repo = work / "ctx" / "testbed"
    repo.parent.mkdir()
    (next((work / "src").iterdir())).rename(repo)
    source, tests = (repo / "six.py").read_text(), (repo / TEST_FILE).read_text()
    assert FIXED in source, "six's source changed: update the recipe"
    (repo / "six.py").write_text(source.replace(FIXED, BUGGY))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "six 1.17.0")
    (repo / "six.py").write_text(source)
    patch = git(repo, "diff")
    git(repo, "checkout", "-q", "--", ".")
    (repo / TEST_FILE).write_text(tests + NEW_TEST)
    test_patch = git(repo, "diff")
    git(repo, "checkout", "-q", "--", ".")
    return repo, {"patch": patch, "test_patch": test_patch, "base_commit": git(repo, "rev-parse", "HEAD").strip(),
                  "test_source": NEW_TEST}


def eval_script(base_commit: str, test_patch: str) -> str:
    return "\n".join([
        "#!/bin/bash", "set -uxo pipefail", "cd /testbed",
        "git config --global --add safe.directory /testbed",
        "git status", f"git -c core.fileMode=false diff {base_commit}",
        f"git checkout {base_commit} {TEST_FILE}",
        "git apply -v - <<'EOF_114329324912'", test_patch.rstrip("\n"), "EOF_114329324912",
        ": '>>>>> Start Test Output'",
        f"python3 -m pytest -rA -p no:cacheprovider {TEST_FILE}",
        ": '>>>>> End Test Output'",
        f"git checkout {base_commit} {TEST_FILE}", "",
    ])


def write_harbor(task: Path, patches: dict[str, str]) -> None:
    (task / "tests").mkdir(parents=True)
    (task / "solution").mkdir()
    (task / "instruction.md").write_text(PROBLEM + "\nThe repository is at /testbed.\n")
    (task / "task.toml").write_text(
        'version = "1.0"\n\n[metadata]\ndifficulty = "easy"\ncategory = "debugging"\ntags = ["python", "six"]\n\n'
        '[verifier]\ntimeout_sec = 120.0\n\n[agent]\ntimeout_sec = 600.0\n\n'
        f'[environment]\ndocker_image = "{IMAGE}"\ncpus = 1\nmemory = "1G"\nstorage = "2G"\nallow_internet = false\n')
    (task / "tests" / "test_ensure_text.py").write_text("import six\n" + patches["test_source"])
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\n# Harbor's verifier: the hidden test and the package's own suite; the reward in /logs/verifier.\n"
        "cd /testbed\nmkdir -p /logs/verifier\n"
        f"if python3 -m pytest -q -p no:cacheprovider /tests/test_ensure_text.py {TEST_FILE}; then\n"
        "    echo 1 > /logs/verifier/reward.txt\nelse\n    echo 0 > /logs/verifier/reward.txt\nfi\n")
    (task / "solution" / "solve.sh").write_text(
        "#!/bin/bash\nset -euo pipefail\ncd /testbed\ngit apply - <<'EOF_PATCH'\n" + patches["patch"] + "EOF_PATCH\n")


def build(out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="repo-task-") as tmp:
        work = Path(tmp)
        repo, patches = make_repo(work)
        run(sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:", PYTEST, "-d", str(work / "ctx" / "wheels"))
        (work / "ctx" / "Dockerfile").write_text(DOCKERFILE.format(base=BASE_IMAGE, recipe=RECIPE))
        run("docker", "build", "-q", "--label", "agentrl.repo.image=1", "-t", IMAGE, str(work / "ctx"))
        staging = Path(tempfile.mkdtemp(prefix=f".{RECIPE}.", dir=out.parent))
        row = {"instance_id": INSTANCE_ID, "repo": "benjaminp/six", "version": "1.17", "base_commit": patches["base_commit"],
               "problem_statement": PROBLEM, "hints_text": "", "patch": patches["patch"], "test_patch": patches["test_patch"],
               "FAIL_TO_PASS": json.dumps(F2P), "PASS_TO_PASS": json.dumps(P2P), "image": IMAGE,
               "eval_script": eval_script(patches["base_commit"], patches["test_patch"]),
               "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail"}
        (staging / "instances.jsonl").write_text(json.dumps(row) + "\n")
        write_harbor(staging / "harbor" / "six-ensure-text", patches)
        staging.rename(out)


def main() -> None:
    cache = Path(os.environ.get("AGENTRL_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "agentrl")
    out = cache / "repo-tasks" / RECIPE
    out.parent.mkdir(parents=True, exist_ok=True)
    have_image = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode == 0
    if not (have_image and (out / "instances.jsonl").exists()):
        import fcntl
        with open(out.parent / "build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            have_image = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode == 0
            if not (have_image and (out / "instances.jsonl").exists()):
                if out.exists():
                    subprocess.run(["rm", "-rf", str(out)], check=True)
                try:
                    build(out)
                except subprocess.CalledProcessError as e:
                    raise SystemExit(f"repo-task: {' '.join(e.cmd[:4])} failed: {e.stderr.strip()[-2000:]}") from e
    print(out)


if __name__ == "__main__":
    main()

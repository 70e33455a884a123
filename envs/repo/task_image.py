"""Images of generated repository tasks: a local repository's image, and one image per instance over it.

What it is: the Docker side of task generation (``envs/repo/generate.py``), offline, the way
``docker/repo-task/build.py`` builds the six fixture: FROM the offline sandbox image
(``make sandbox-image``), git and patch from the machine's Debian mirror, pytest (and any
requirement given) as wheels the host's pip downloaded, unpacked into site-packages.

  * ``repo_image``: the repository at ``/testbed`` with no git history at all, tagged
    ``agentrl-gen-<name>:<hash of the recipe and the tree>`` (built once);
  * ``instance_image``: FROM that, the buggy file copied in and a fresh history of one commit
    (fixed author and dates, so the same bug gives the same ``base_commit``): nothing of the
    fix is in it. Tagged ``agentrl-gen-<name>:<instance hash>``; returns the commit.

Every image is labelled ``agentrl.repo.generated=<name>``. What it is not: running tests
(``RepoPool``) or grading (``envs/repo/grading.py``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from agentrl.errors import EnvError
from envs.repo.mutate import copy_source

BASE_IMAGE = os.environ.get("AGENTRL_SANDBOX_IMAGE", "agentrl-sandbox:latest")
LABEL = "agentrl.repo.generated"
GIT_ENV = ("GIT_AUTHOR_NAME=agentrl GIT_AUTHOR_EMAIL=agentrl@localhost GIT_AUTHOR_DATE=2024-12-01T00:00:00Z "
           "GIT_COMMITTER_NAME=agentrl GIT_COMMITTER_EMAIL=agentrl@localhost GIT_COMMITTER_DATE=2024-12-01T00:00:00Z")
REPO_DOCKERFILE = """FROM {base}
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends git patch \\
    >/dev/null && rm -rf /var/lib/apt/lists/*
COPY wheels /tmp/wheels
RUN site=$(python3 -c 'import site; print(site.getsitepackages()[0])') && mkdir -p "$site" \\
 && for w in /tmp/wheels/*.whl; do python3 -m zipfile -e "$w" "$site"; done && rm -rf /tmp/wheels
COPY testbed /testbed
WORKDIR /testbed
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONPATH={pythonpath} {git_env}
"""
INSTANCE_DOCKERFILE = """FROM {repo_image}
COPY buggy /testbed/{path}
RUN git init -q -b main && git add -A && git commit -q -m "{name} at its base commit" \\
 && git rev-parse HEAD > /.agentrl-base-commit
"""


def docker(*args: str, timeout_s: float = 1800) -> str:
    try:
        out = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError as e:
        raise EnvError("generating tasks needs the docker CLI and an engine (make sandbox-image starts one)") from e
    if out.returncode != 0:
        raise EnvError(f"docker {' '.join(args[:3])} failed: {out.stderr.strip()[-1500:]}")
    return out.stdout


def image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def _tree_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def repo_image(source: Path, name: str, requirements: tuple[str, ...] = ("pytest==8.3.5",)) -> str:
    """The image of the repository in ``source`` (see the module docstring); built once per content."""
    with tempfile.TemporaryDirectory(prefix="agentrl-repo-image-") as tmp:
        ctx = Path(tmp)
        copy_source(source, ctx / "testbed")
        pythonpath = "/testbed/src" if (ctx / "testbed" / "src").is_dir() else "/testbed"
        dockerfile = REPO_DOCKERFILE.format(base=BASE_IMAGE, pythonpath=pythonpath, git_env=GIT_ENV)
        recipe = hashlib.sha256((dockerfile + repr(requirements) + _tree_hash(ctx / "testbed")).encode()).hexdigest()
        tag = f"agentrl-gen-{name}:repo-{recipe[:12]}"
        if image_exists(tag):
            return tag
        pip = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:", *requirements,
                              "-d", str(ctx / "wheels")], capture_output=True, text=True)
        if pip.returncode != 0:
            raise EnvError(f"pip could not download wheels of {list(requirements)}: {pip.stderr.strip()[-800:]}")
        (ctx / "Dockerfile").write_text(dockerfile)
        docker("build", "-q", "--label", f"{LABEL}={name}", "-t", tag, str(ctx))
    return tag


def instance_image(repo_tag: str, name: str, path: str, buggy: str) -> tuple[str, str]:
    """(tag, base_commit) of the image with ``buggy`` as ``path`` and a history of one commit."""
    dockerfile = INSTANCE_DOCKERFILE.format(repo_image=repo_tag, path=path, name=name)
    key = hashlib.sha256((dockerfile + buggy).encode()).hexdigest()[:12]
    tag = f"agentrl-gen-{name}:{key}"
    if not image_exists(tag):
        with tempfile.TemporaryDirectory(prefix="agentrl-instance-") as tmp:
            (Path(tmp) / "buggy").write_text(buggy, encoding="utf-8")
            (Path(tmp) / "Dockerfile").write_text(dockerfile)
            docker("build", "-q", "--label", f"{LABEL}={name}", "-t", tag, tmp)
    commit = docker("run", "--rm", "--network", "none", "--entrypoint", "cat", tag, "/.agentrl-base-commit").strip()
    return tag, commit

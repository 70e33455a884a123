"""RepoTask: one repository task read unchanged from either format, with its container spec.

What it is: the reader of the two formats ``agentrl/Repo-v0`` plays.

  * **SWE-bench** rows as ``swebench`` 5.x defines them (``instance_id``, ``repo``,
    ``base_commit``, ``problem_statement``, ``patch``, ``test_patch``, ``FAIL_TO_PASS``,
    ``PASS_TO_PASS``, ``image``, ``eval_script``, ``log_parser``; ``version`` and
    ``eval_type`` default to ``""`` and ``pass_and_fail``), from JSONL or Parquet (SWE-Gym,
    SWE-smith and R2E-Gym rows in that schema too). The repository is at ``/testbed``.
    One field of ours, optional: ``files`` (relative path -> text), the repository itself
    for instances that share one image (``envs/repo/tiny_repos.py``): written into
    ``/testbed`` when the episode's (and the grading's) container is handed out and
    committed as one commit (``FILES_COMMIT``: fixed author and dates), whose hash must be
    the row's ``base_commit``.
  * **Harbor** task directories (the Terminal-Bench 2.0 format): ``instruction.md``,
    ``task.toml`` (``[environment]``: ``docker_image`` or an ``environment/Dockerfile``, built
    once and tagged by its content's hash; ``cpus``, ``memory`` / ``memory_mb``, ``storage`` /
    ``storage_mb``, ``allow_internet``, ``[[environment.mcp_servers]]`` (``harbor_mcp_servers``);
    ``[verifier]``: ``timeout_sec``, ``env``; ``[agent]``:
    ``timeout_sec``), ``tests/`` (``test.sh`` writes ``/logs/verifier/reward.txt`` or
    ``reward.json``) and ``solution/solve.sh``. A row names one as ``{"task_dir": path}``.

What it is not: grading (``envs/repo/grading.py``) or the container (``sandboxes/``).
Nothing of the ``harbor`` or ``swebench`` packages is needed to read a task.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agentrl.env.datasets import load_rows
from agentrl.errors import EnvError
from envs.repo.task_image import GIT_ENV
from sandboxes.repo_container import ContainerSpec

SWEBENCH_KEYS = ("instance_id", "base_commit", "problem_statement", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS",
                 "image", "eval_script", "log_parser")
SWEBENCH_WORKDIR = "/testbed"
STRIP_HISTORY = (  # what the episode's repository keeps: the base commit and its past, nothing later
    "git config --global --add safe.directory \"$PWD\" 2>/dev/null; "
    "for r in $(git remote); do git remote remove \"$r\"; done; "
    "head=$(git symbolic-ref -q HEAD || true); "
    "git for-each-ref --format='%(refname)' | while read -r ref; do "
    "[ \"$ref\" = \"$head\" ] || git update-ref -d \"$ref\"; done; "
    "git stash clear 2>/dev/null; git reflog expire --expire=now --all && git gc -q --prune=now")
FILES_COMMIT = (  # a row's ``files`` made a repository of one commit; the same hash wherever it runs
    f"chmod 644 -- \"$@\" && rm -rf .git && git init -q && git add -A && env {GIT_ENV} "
    "git -c commit.gpgsign=false -c core.hooksPath=/dev/null commit -q -m 'the task files' && git rev-parse HEAD")


@dataclass
class RepoTask:
    """One task: what the agent reads, where it works, and how it is graded."""

    kind: str  # "swebench" | "harbor"
    task_id: str
    instruction: str
    spec: ContainerSpec
    row: dict[str, Any] = field(default_factory=dict)  # the SWE-bench row, as read
    task_dir: Path | None = None  # the Harbor directory
    verifier_timeout_s: float = 1800.0
    verifier_env: dict[str, str] = field(default_factory=dict)
    mcp_servers: list[dict[str, Any]] = field(default_factory=list)  # Harbor's, checked (harbor_mcp_servers)

    @property
    def files(self) -> dict[str, str]:
        """The row's ``files`` (relative path -> text), written into the workdir at the start; {} when none."""
        return dict(self.row.get("files") or {})

    @property
    def test_files(self) -> list[str]:
        """Files the grading tests touch (SWE-bench: those of ``test_patch``), left out of the agent's diff."""
        return sorted(set(re.findall(r"^diff --git a/(\S+) b/", self.row.get("test_patch", ""), re.MULTILINE)))


def swebench_task(row: dict[str, Any], base: ContainerSpec, strip_history: bool = True) -> RepoTask:
    missing = [k for k in SWEBENCH_KEYS if not row.get(k) and row.get(k) != []
               and not (k == "test_patch" and row.get(k) == "")]  # SWE-smith's rows: the tests are in the repository
    if missing:
        raise EnvError(f"SWE-bench row {row.get('instance_id', '?')!r} lacks {missing}; rows follow swebench 5.x "
                       f"({', '.join(SWEBENCH_KEYS)}), with the instance's image built or pulled")
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        value = row[key]
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise EnvError(f"{row['instance_id']}: {key} must be a JSON list of test names, got {value[:80]!r}") from e
        if not isinstance(value, list):
            raise EnvError(f"{row['instance_id']}: {key} must be a list of test names, got {type(value).__name__}")
    files = row.get("files") or {}
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) and k and not k.startswith("/")
                                              and ".." not in Path(k).parts for k, v in files.items()):
        raise EnvError(f"{row['instance_id']}: files must map relative paths (no '..') to their text, "
                       f"got {str(files)[:120]!r}")
    row = {"version": "", "eval_type": "pass_and_fail", "repo": "", **row}
    strip = strip_history and not files  # files are committed afresh: there is no history to strip
    spec = replace(base, image=row["image"], workdir=SWEBENCH_WORKDIR, prepare=STRIP_HISTORY if strip else "")
    return RepoTask("swebench", row["instance_id"], row["problem_statement"], spec, row=row)


def _megabytes(value: Any, key: str) -> int:
    """``"4G"``, ``"512M"``, ``"2048"`` (MB) or a number of MB."""
    if isinstance(value, (int, float)):
        return int(value)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(value), re.IGNORECASE)
    if not m:
        raise EnvError(f"task.toml: {key} = {value!r} is not a size (e.g. \"4G\", \"512M\")")
    scale = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1 << 20}[m.group(2).upper()]
    return max(1, int(float(m.group(1)) * scale))


HARBOR_MCP_KEYS = ("name", "transport", "url", "command", "args")
HARBOR_TRANSPORTS = ("sse", "streamable-http", "stdio")


def _loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback or ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def harbor_mcp_servers(entries: Any, where: Path) -> list[dict[str, Any]]:
    """``[[environment.mcp_servers]]`` as Harbor defines them (``name``; ``transport``: ``sse``,
    the default, ``streamable-http`` or ``stdio``; ``url`` or ``command`` and ``args``), checked.
    A URL is resolved inside the task's container in Harbor; the episode's calls come from
    outside it, so a loopback URL (the container's own) is refused with what to do instead."""
    if not isinstance(entries, list):
        raise EnvError(f"{where}: [[environment.mcp_servers]] must be an array of tables, got {entries!r:.80}")
    out = []
    for i, entry in enumerate(entries):
        at = f"{where}: environment.mcp_servers[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise EnvError(f"{at} needs a name (a table with name, transport, url or command and args)")
        unknown = sorted(set(entry) - set(HARBOR_MCP_KEYS))
        if unknown:
            raise EnvError(f"{at} ({entry['name']}): unknown field(s) {unknown}; Harbor's are {list(HARBOR_MCP_KEYS)}")
        server = {"transport": "sse", "args": [], **entry}
        transport, url, command = server["transport"], server.get("url"), server.get("command")
        if transport not in HARBOR_TRANSPORTS:
            raise EnvError(f"{at} ({entry['name']}): transport {transport!r} is not one of {list(HARBOR_TRANSPORTS)}")
        if transport == "stdio" and not (isinstance(command, str) and command):
            raise EnvError(f"{at} ({entry['name']}): transport 'stdio' needs a command (and args)")
        if not (isinstance(server["args"], list) and all(isinstance(a, str) for a in server["args"])):
            raise EnvError(f"{at} ({entry['name']}): args must be a list of strings, got {server['args']!r:.80}")
        if transport != "stdio":
            if not (isinstance(url, str) and url.startswith(("http://", "https://"))):
                raise EnvError(f"{at} ({entry['name']}): transport {transport!r} needs an http(s) url, got {url!r}")
            if _loopback(url):
                raise EnvError(f"{at} ({entry['name']}): {url} is the task container's own loopback, where Harbor's "
                               "agent runs; agentrl calls the server from outside the container. Declare it as "
                               "transport = \"stdio\" (run inside the container) or give a URL the trainer reaches")
        out.append(server)
    return out


def harbor_task(task_dir: str | Path, base: ContainerSpec, build_image: Any = None) -> RepoTask:
    """The Harbor task in ``task_dir``; ``build_image(context_dir, tag)`` builds an
    ``environment/Dockerfile`` when ``task.toml`` names no ``docker_image``."""
    path = Path(task_dir)
    for name in ("instruction.md", "task.toml", "tests/test.sh"):
        if not (path / name).is_file():
            raise EnvError(f"{path} is not a Harbor task directory: {name} is missing "
                           "(expected instruction.md, task.toml, tests/test.sh)")
    try:
        config = tomllib.loads((path / "task.toml").read_text())
    except tomllib.TOMLDecodeError as e:
        raise EnvError(f"{path / 'task.toml'}: not valid TOML ({e})") from e
    env, verifier = config.get("environment", {}), config.get("verifier", {})
    image = env.get("docker_image")
    if not image:
        dockerfile = path / "environment" / "Dockerfile"
        if not dockerfile.is_file():
            raise EnvError(f"{path}: task.toml names no [environment] docker_image and there is no environment/Dockerfile")
        digest = hashlib.sha256()
        for f in sorted(p for p in (path / "environment").rglob("*") if p.is_file()):
            digest.update(str(f.relative_to(path)).encode() + b"\0" + f.read_bytes())
        image = f"agentrl-harbor-{re.sub(r'[^a-z0-9_.-]', '-', path.name.lower())}:{digest.hexdigest()[:12]}"
        if build_image is None:
            raise EnvError(f"{path}: building environment/Dockerfile needs an engine (build_image)")
        build_image(path / "environment", image)
    spec = replace(base, image=image, workdir="",
                   cpus=float(env.get("cpus", base.cpus)),
                   memory_mb=_megabytes(env["memory_mb"] if "memory_mb" in env else env.get("memory", base.memory_mb), "memory"),
                   disk_mb=_megabytes(env["storage_mb"] if "storage_mb" in env else env.get("storage", base.disk_mb), "storage"),
                   network=bool(env.get("allow_internet", base.network)))
    return RepoTask("harbor", path.name, (path / "instruction.md").read_text(), spec, task_dir=path,
                    verifier_timeout_s=float(verifier.get("timeout_sec", 1800.0)),
                    verifier_env={str(k): str(v) for k, v in verifier.get("env", {}).items()},
                    mcp_servers=harbor_mcp_servers(env.get("mcp_servers", []), path / "task.toml"))


def read_task(row: dict[str, Any], base: ContainerSpec, *, strip_history: bool = True, build_image: Any = None) -> RepoTask:
    """A row of either format: a SWE-bench instance, or ``{"task_dir": path}``."""
    if "task_dir" in row:
        return harbor_task(row["task_dir"], base, build_image)
    if "instance_id" in row:
        return swebench_task(row, base, strip_history)
    raise EnvError(f"a repository task row is a SWE-bench instance (instance_id, ...) or {{'task_dir': path}} "
                   f"of a Harbor task; got keys {sorted(row)}")


def load_tasks(dataset: str | Path) -> list[dict[str, Any]]:
    """Rows of ``dataset``: a JSONL/Parquet file of SWE-bench rows, one Harbor task directory,
    or a folder of Harbor task directories."""
    path = Path(dataset)
    if path.is_dir() and (path / "task.toml").is_file():
        return [{"task_dir": str(path)}]
    if path.is_dir() and not (path / "dataset_info.json").exists() and not (path / "dataset_dict.json").exists():
        rows = [{"task_dir": str(p)} for p in sorted(path.iterdir()) if (p / "task.toml").is_file()]
        if not rows:
            raise EnvError(f"{path}: no Harbor task directories (folders with task.toml) in it")
        return rows
    return load_rows(path)

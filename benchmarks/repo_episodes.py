"""Repository-task episodes in Docker: start, command round trip, concurrency, grading.

    .venv/bin/python benchmarks/repo_episodes.py [--starts 12] [--commands 50] [--episodes 32]

On the test task's image (``make repo-images``: six 1.17.0 at /testbed), all in the same run:

  * episode start — from "episode begins" to "its first command answered": a warm
    ``RepoPool`` (a started container with its shell, refilled between episodes) against a cold
    ``docker run -d`` + ``docker exec`` of the first command (p50/p95; ``ratio_start``);
  * per-command round trip — ``true`` in the episode's persistent shell against one
    ``docker exec <container> bash -lc true`` per command, which is what mini-swe-agent's own
    Docker environment does (p50; ``ratio_command``, goal >= 5);
  * concurrency — ``--episodes`` episodes at once of a scripted agent (10 shell commands and one
    run of a few of the package's tests each): failed episodes, episodes per minute, and the
    containers left behind afterwards (goal 0);
  * grading — one SWE-bench grading of the gold patch (fresh container, eval script,
    swebench's report), seconds per instance.

The last line is one JSON object. Needs a Docker engine and `make repo-images`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from envs.repo.grading import grade_swebench  # noqa: E402
from envs.repo.tasks import read_task  # noqa: E402
from sandboxes.repo_container import LABEL, ContainerSpec  # noqa: E402
from sandboxes.repo_pool import RepoPool  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEST_RUN = "python3 -m pytest -q -p no:cacheprovider test_six.py -k 'test_b or test_u'"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True, text=True).stdout.strip()


async def warm_starts(pool: RepoPool, spec: ContainerSpec, n: int) -> list[float]:
    out = []
    for _ in range(n):
        if not pool._idle[spec]:  # the last episode's refill has not finished: wait for one, untimed
            await pool.prewarm(spec, 1)
        t0 = time.perf_counter()
        async with pool.episode(spec) as s:
            await s.bash("true", 30)
            out.append(time.perf_counter() - t0)
    return out


def cold_starts(image: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        cid = _docker("run", "-d", "--rm", "--network", "none", "--label", f"{LABEL}.bench=1", image, "sleep", "600")
        _docker("exec", "-w", "/testbed", cid, "bash", "-lc", "true")
        out.append(time.perf_counter() - t0)
        _docker("rm", "-f", cid)
    return out


async def command_round_trips(pool: RepoPool, spec: ContainerSpec, n: int) -> tuple[list[float], list[float]]:
    ours, per_exec = [], []
    async with pool.episode(spec) as s:
        for _ in range(n):
            t0 = time.perf_counter()
            await s.bash("true", 30)
            ours.append(time.perf_counter() - t0)
        cid = s.box.container.id
        for _ in range(n):
            t0 = time.perf_counter()
            _docker("exec", "-w", "/testbed", cid, "bash", "-lc", "true")
            per_exec.append(time.perf_counter() - t0)
    return ours, per_exec


async def scripted_episode(pool: RepoPool, spec: ContainerSpec) -> bool:
    try:
        async with pool.episode(spec) as s:
            for i in range(10):
                r = await s.bash(f"cd /testbed && git status --short | wc -l && echo {i} > /tmp/n && cat /tmp/n", 120)
                if r.exit_code != 0:
                    return False
            return (await s.bash(TEST_RUN, 300)).exit_code == 0
    except Exception:
        return False


async def measure(args: argparse.Namespace, row: dict) -> None:
    spec = ContainerSpec(image=row["image"], workdir="/testbed")
    pool = RepoPool(warm=1, max_warm=args.episodes)
    try:
        await pool.prewarm(spec)
        warm = await warm_starts(pool, spec, args.starts)
        cold = cold_starts(row["image"], args.starts)
        ours, per_exec = await command_round_trips(pool, spec, args.commands)
        t0 = time.perf_counter()
        ok = await asyncio.gather(*[scripted_episode(pool, spec) for _ in range(args.episodes)])
        wall = time.perf_counter() - t0
        task = read_task(row, ContainerSpec(image=""))
        g0 = time.perf_counter()
        graded = await grade_swebench(pool, task, row["patch"], 600)
        grade_s = time.perf_counter() - g0
    finally:
        await pool.aclose()
    left = ""
    with contextlib.suppress(subprocess.CalledProcessError):
        left = _docker("ps", "-aq", "--filter", f"label={LABEL}.owner={pool.owner}")
    out = {
        "benchmark": "repo_episodes",
        "start_warm_p50_s": statistics.median(warm), "start_warm_p95_s": _pct(warm, 0.95),
        "start_cold_p50_s": statistics.median(cold), "start_cold_p95_s": _pct(cold, 0.95),
        "ratio_start": statistics.median(cold) / statistics.median(warm),
        "command_p50_ms": 1000 * statistics.median(ours), "docker_exec_p50_ms": 1000 * statistics.median(per_exec),
        "ratio_command": statistics.median(per_exec) / statistics.median(ours),
        "episodes": args.episodes, "episodes_failed": ok.count(False),
        "episodes_per_min": 60 * args.episodes / wall, "containers_left": len(left.split()),
        "grade_s": grade_s, "gold_resolved": graded["resolved"],
        "load_avg_1m": os.getloadavg()[0], "cpus": os.cpu_count(),
    }
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starts", type=int, default=12)
    ap.add_argument("--commands", type=int, default=50)
    ap.add_argument("--episodes", type=int, default=32)
    args = ap.parse_args()
    folder = Path(subprocess.run([sys.executable, str(ROOT / "docker/repo-task/build.py")], check=True,
                                 capture_output=True, text=True).stdout.strip())
    asyncio.run(measure(args, json.loads((folder / "instances.jsonl").read_text())))


if __name__ == "__main__":
    main()

"""Sandbox throughput and latency: LocalSandbox jails (root and rootless mode) and the warm
DockerSandbox pool against one ``docker run --rm`` per execution, all in the same run.

    .venv/bin/python benchmarks/sandbox.py [--n 80] [--baseline-n 16] [--skip-docker]
                                           [--rootless-python /usr/bin/python3]

A trivial Python program (``print(1)``) is run at concurrency 1 and 8 on each backend;
executions per second and p50/p99 latency are reported, and for LocalSandbox the CPU time
per execution of the whole process tree (cgroup v1 cpuacct, as root) with the throughput that
cost allows on idle cores. The rootless mode runs its fork server (in bubblewrap) as
``nobody`` when started by root, under ``--rootless-python`` (an interpreter that user can
read; the root mode runs the one running this script). The last line is one JSON object;
``"ratio"`` is Docker pool throughput / ``docker run`` throughput, both at concurrency 8.
Targets (2 CPU cores): LocalSandbox (root mode) >= 80 executions/s; Docker pool p50 <= 40 ms
and >= 5x the ``docker run`` baseline. Needs root (root-mode jails), bubblewrap (rootless)
and, for Docker, `make sandbox-image`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agentrl.api import ExecRequest, ExecStatus  # noqa: E402
from agentrl.plugins import make_sandbox  # noqa: E402

PROGRAM = "print(1)"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def measure(run_one, n: int, concurrency: int) -> dict[str, float]:
    """Run ``n`` executions with ``concurrency`` workers; throughput and latency."""
    latencies: list[float] = []
    failures = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)

    async def worker() -> None:
        nonlocal failures
        while True:
            try:
                queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            t = time.perf_counter()
            ok = await run_one()
            latencies.append((time.perf_counter() - t) * 1000)
            failures += 0 if ok else 1

    start = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    elapsed = time.perf_counter() - start
    return {
        "execs_per_s": round(n / elapsed, 2),
        "p50_ms": round(statistics.median(latencies), 2),
        "p99_ms": round(_pct(latencies, 0.99), 2),
        "failures": failures,
    }


def sandbox_runner(sandbox):
    async def run_one() -> bool:
        r = await sandbox.run(ExecRequest(code=PROGRAM, time_limit_s=10, memory_limit_mb=256))
        return r.status is ExecStatus.OK and r.stdout == "1\n"

    return run_one


def docker_run_runner(image: str):
    async def run_one() -> bool:
        proc = await asyncio.create_subprocess_exec(
            "docker", "run", "--rm", "--network", "none", "--memory", "256m", "--pids-limit", "128",
            "--read-only", "--cap-drop", "ALL", image, "python3", "-I", "-S", "-c", PROGRAM,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
        return proc.returncode == 0 and out == b"1\n"

    return run_one


class CpuMeter:
    """CPU seconds used by this process and its children (the jails), from a cgroup v1
    cpuacct group this benchmark moves itself into; None where that is not possible."""

    def __init__(self) -> None:
        self.path = None
        base = "/sys/fs/cgroup/cpuacct"
        if os.geteuid() == 0 and os.path.isdir(base):
            path = f"{base}/agentrl-bench-{os.getpid()}"
            try:
                os.makedirs(path, exist_ok=True)
                with open(f"{path}/cgroup.procs", "w") as f:
                    f.write(str(os.getpid()))
                self.path = path
            except OSError:
                self.path = None

    def read(self) -> float | None:
        if self.path is None:
            return None
        with open(f"{self.path}/cpuacct.usage") as f:
            return int(f.read()) / 1e9

    def close(self) -> None:
        if self.path is not None:
            with open(f"{os.path.dirname(self.path)}/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
            try:
                os.rmdir(self.path)
            except OSError:
                pass


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=80, help="executions per measurement (default 80)")
    ap.add_argument("--baseline-n", type=int, default=16, help="`docker run` executions per measurement (default 16)")
    ap.add_argument("--skip-docker", action="store_true", help="measure LocalSandbox only")
    ap.add_argument("--rootless-python", default="/usr/bin/python3",
                    help="interpreter of the rootless jails, readable by their unprivileged user (default /usr/bin/python3)")
    args = ap.parse_args()
    out: dict[str, float | int | str | None] = {
        "cpus": os.cpu_count(), "program": PROGRAM, "load_avg_1m_at_start": round(os.getloadavg()[0], 2)}

    meter = CpuMeter()  # before the fork servers start, so the jails are counted too
    for name, options in (("local", {"mode": "root"}),
                          ("local_rootless", {"mode": "rootless", "python": args.rootless_python})):
        local = make_sandbox("local", max_concurrency=8, **options)
        await measure(sandbox_runner(local), 8, 8)  # warm the fork server
        for c in (1, 8):
            before = meter.read()
            m = await measure(sandbox_runner(local), args.n, c)
            after = meter.read()
            if before is not None and after is not None:
                m["cpu_ms_per_exec"] = round((after - before) / args.n * 1000, 2)
            print(f"{name:<14} c={c}: {m}", flush=True)
            for k, v in m.items():
                out[f"{name}_c{c}_{k}"] = v
        await local.aclose()
        out[f"{name}_execs_per_s"] = out[f"{name}_c8_execs_per_s"]
        cpu_ms = out.get(f"{name}_c8_cpu_ms_per_exec")
        # what the measured CPU cost allows when every core is ours (the machine may be shared)
        out[f"{name}_cpu_bound_execs_per_s"] = round(1000 * (os.cpu_count() or 1) / cpu_ms, 1) if cpu_ms else None
    meter.close()
    out["load_avg_1m_after_local"] = round(os.getloadavg()[0], 2)

    if not args.skip_docker:
        docker = make_sandbox("docker", pool_size=8, memory_mb=256)
        await docker.start()
        await measure(sandbox_runner(docker), 16, 8)  # warm
        for c in (1, 8):
            m = await measure(sandbox_runner(docker), args.n, c)
            print(f"docker     c={c}: {m}", flush=True)
            for k, v in m.items():
                out[f"docker_c{c}_{k}"] = v
        await docker.aclose()
        image = docker.config.image
        for c in (1, 8):
            m = await measure(docker_run_runner(image), args.baseline_n, c)
            print(f"docker run c={c}: {m}", flush=True)
            for k, v in m.items():
                out[f"docker_run_c{c}_{k}"] = v
        out["docker_p50_ms"] = out["docker_c1_p50_ms"]
        out["docker_execs_per_s"] = out["docker_c8_execs_per_s"]
        out["docker_run_execs_per_s"] = out["docker_run_c8_execs_per_s"]
        out["ratio"] = round(out["docker_c8_execs_per_s"] / out["docker_run_c8_execs_per_s"], 2)
        out["ratio_c1"] = round(out["docker_c1_execs_per_s"] / out["docker_run_c1_execs_per_s"], 2)
    else:
        out["docker_p50_ms"] = None
        out["ratio"] = None
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())

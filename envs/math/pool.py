"""A pool of killable worker processes that run the math verifier, and ``math_reward_fn``.

What it is: ``VerifierPool`` — worker processes (``python -c``, fed JSON lines) behind a job
queue, one dispatcher thread per worker that hands its worker up to ``batch_size`` queued
jobs at a time (no round trip per job). A verification that runs past ``hard_timeout_s``
gets its worker killed and replaced (math-verify's own timeout uses ``signal.alarm``, which
only works on a main thread, so it cannot be the last line of defence); workers are
recycled after ``max_tasks_per_worker`` tasks (sympy's caches grow) and run under an
address-space limit. ``averify`` awaits futures, so the event loop never blocks; plain number
literals (``compare_numbers``) are decided in-process without a round trip, and a reply with
several boxes is right only if each is. What it is not: the comparison rules — those are in
envs/math/verifier.py, with their reasons.

Main hooks::

    math_reward_fn(response, gold) -> float          # 1.0 or 0.0, shared default pool
    await amath_reward_fn(response, gold)            # the same, awaitable
    with VerifierPool(VerifierConfig(workers=2)) as pool:
        pool.verify(response, gold); await pool.averify(response, gold)
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import json
import logging
import os
import queue
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from agentrl.config import option
from agentrl.errors import VerifierError
from envs.math.verifier import compare_numbers, extract_answers, normalize_gold

log = logging.getLogger(__name__)

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The folder that holds the ``envs`` package (put on the workers' PYTHONPATH)."""
STARTUP_TIMEOUT_S = 60.0
"""Longest a new worker may take to import math-verify (not counted in the hard timeout)."""


@dataclass
class VerifierConfig:
    """How the verifier pool runs."""

    workers: int = option(2, help="worker processes (each verifies one answer at a time)", ge=1)
    hard_timeout_s: float = option(10.0, help="a verification running longer is killed with its worker", gt=0)
    soft_timeout_s: int = option(3, help="math-verify's own parse/verify timeout inside a worker", ge=1)
    max_tasks_per_worker: int = option(5000, help="a worker is replaced after this many tasks", ge=1)
    memory_limit_mb: int = option(4096, help="address-space limit of a worker (0: none)", ge=0)
    max_wait_s: float = option(120.0, help="longest an averify call waits, queueing included", gt=0)
    batch_size: int = option(
        16, help="jobs sent to a worker at once (it works through them without waiting on a round "
        "trip per job; the hard timeout still applies to each job)", ge=1)


class _Worker:
    """One worker process and its line protocol."""

    def __init__(self, cfg: VerifierConfig) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), env.get("PYTHONPATH", "")]))
        env["AGENTRL_VERIFIER_MEMORY_MB"] = str(cfg.memory_limit_mb)
        env["AGENTRL_VERIFIER_SOFT_TIMEOUT_S"] = str(cfg.soft_timeout_s)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from envs.math.verifier import _worker_main; _worker_main()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True,
        )
        self._buf = b""
        self.tasks = 0
        try:
            if self._read(STARTUP_TIMEOUT_S) != ["ready"]:
                raise ValueError("the worker did not say it was ready")
        except BaseException:
            self.kill()
            raise

    def send(self, jobs: list[tuple[str, str]]) -> None:
        """Queue jobs ``(answer, gold)`` in the worker's stdin; replies come in the same order."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("".join(json.dumps(job) + "\n" for job in jobs).encode())
        self.proc.stdin.flush()
        self.tasks += len(jobs)

    def reply(self, timeout_s: float) -> list[Any]:
        """The next reply; TimeoutError after ``timeout_s``, EOFError if the worker died."""
        return self._read(timeout_s)

    def _read(self, timeout_s: float) -> list[Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass

    def stop(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


class VerifierPool:
    """Worker processes behind a job queue; one dispatcher thread per worker enforces the hard
    timeout (kill and replace the worker) and recycles workers after ``max_tasks_per_worker``."""

    def __init__(self, cfg: VerifierConfig | None = None) -> None:
        self.cfg = cfg or VerifierConfig()
        self._jobs: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()
        self.stats = {"verified": 0, "timeouts": 0, "errors": 0, "restarts": 0}
        self._closed = False
        self._threads = [
            threading.Thread(target=self._dispatch, name=f"verifier-dispatch-{i}", daemon=True)
            for i in range(self.cfg.workers)
        ]
        for t in self._threads:
            t.start()

    def submit(self, answer: str, gold: str) -> concurrent.futures.Future[bool]:
        """Queue one comparison of an *extracted* answer with a *normalized* gold."""
        if self._closed:
            raise VerifierError("the verifier pool is closed")
        fut: concurrent.futures.Future[bool] = concurrent.futures.Future()
        self._jobs.put((fut, answer, gold))
        return fut

    def verify(self, response: str, gold: Any) -> bool:
        """Whether ``response`` answers ``gold`` (blocks; use ``averify`` in async code)."""
        verdict, futures = self._start(response, gold)
        if verdict is not None:
            return verdict
        deadline = time.monotonic() + self.cfg.max_wait_s
        try:
            return all(fut.result(timeout=max(0.0, deadline - time.monotonic())) for fut in futures)
        except concurrent.futures.TimeoutError:
            for fut in futures:
                fut.cancel()
            raise VerifierError(f"verification waited more than {self.cfg.max_wait_s:g} s in the queue") from None

    async def averify(self, response: str, gold: Any) -> bool:
        """Whether ``response`` answers ``gold``; raises VerifierError on a timeout or crash."""
        verdict, futures = self._start(response, gold)
        if verdict is not None:
            return verdict  # plain numbers: decided here, no round trip to a worker
        try:
            async with asyncio.timeout(self.cfg.max_wait_s):
                verdicts = await asyncio.gather(*(asyncio.wrap_future(fut) for fut in futures))
        except TimeoutError:
            for fut in futures:
                fut.cancel()
            raise VerifierError(f"verification waited more than {self.cfg.max_wait_s:g} s in the queue") from None
        return all(verdicts)

    def _start(self, response: str, gold: Any) -> tuple[bool | None, list[concurrent.futures.Future[bool]]]:
        """The verdict if it is clear without a worker (no answer; plain numbers, one of them
        wrong or all right), else the jobs queued for the answers that need math-verify. Every
        answer of a reply must be right (envs/math/verifier.py: a hedge across boxes fails)."""
        answers = extract_answers(response)
        if not answers:
            return False, []
        gold = normalize_gold(gold)
        pending = []
        for answer in answers:
            quick = compare_numbers(answer, gold)
            if quick is False:
                return False, []
            if quick is None:
                pending.append(answer)
        if not pending:
            return True, []
        return None, [self.submit(answer, gold) for answer in pending]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join(timeout=10)

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1

    def _take_batch(self) -> list[Any] | None:
        """Block for one job, then take what else is queued, up to ``batch_size``; None: stop."""
        first = self._jobs.get()
        if first is None:
            return None
        batch = [first]
        while len(batch) < self.cfg.batch_size:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is None:  # another dispatcher's stop signal: hand it on
                self._jobs.put(None)
                break
            batch.append(job)
        return [job for job in batch if job[0].set_running_or_notify_cancel()]

    def _dispatch(self) -> None:
        worker: _Worker | None = None
        try:
            while True:
                pending = self._take_batch()
                if pending is None:
                    return
                while pending:
                    if worker is not None and worker.tasks >= self.cfg.max_tasks_per_worker:
                        worker.stop()
                        worker = None
                        self._count("restarts")
                    if worker is None:
                        try:
                            worker = _Worker(self.cfg)
                        except (TimeoutError, EOFError, OSError, ValueError) as e:
                            self._count("errors")
                            for fut, _, _ in pending:
                                fut.set_exception(VerifierError(
                                    f"a verifier worker could not start ({type(e).__name__}: {e}); "
                                    f"is math-verify installed for {sys.executable}?"))
                            break
                    worker.send([(answer, gold) for _, answer, gold in pending])
                    pending, worker = self._collect(worker, pending)
        finally:
            if worker is not None:
                worker.stop()

    def _collect(self, worker: _Worker, jobs: list[Any]) -> tuple[list[Any], _Worker | None]:
        """Read the replies of ``jobs`` in order. A job past the hard timeout (or a dead worker)
        fails and costs the worker; the jobs after it are returned, to be sent to a new one."""
        for i, (fut, answer, gold) in enumerate(jobs):
            try:
                kind, value = worker.reply(self.cfg.hard_timeout_s)
            except TimeoutError:
                worker.kill()
                self._count("timeouts")
                fut.set_exception(VerifierError(
                    f"verifying {answer[:80]!r} against {gold[:80]!r} took more than "
                    f"{self.cfg.hard_timeout_s:g} s; the worker was killed"))
                return jobs[i + 1:], None
            except (EOFError, OSError, ValueError) as e:
                worker.kill()
                self._count("errors")
                fut.set_exception(VerifierError(f"a verifier worker failed ({type(e).__name__}: {e}); "
                                                "it was replaced"))
                return jobs[i + 1:], None
            if kind == "ok":
                self._count("verified")
                fut.set_result(bool(value))
            else:
                self._count("errors")
                fut.set_exception(VerifierError(value))
        return [], worker


# --------------------------------------------------------------------------- the default pool

_default_pool: VerifierPool | None = None
_default_lock = threading.Lock()


def default_pool() -> VerifierPool:
    """The process-wide pool (``AGENTRL_VERIFIER_WORKERS`` workers, default 2), made on first use."""
    global _default_pool
    with _default_lock:
        if _default_pool is None or _default_pool._closed:
            workers = int(os.environ.get("AGENTRL_VERIFIER_WORKERS", "2"))
            _default_pool = VerifierPool(VerifierConfig(workers=workers))
            atexit.register(_default_pool.close)
        return _default_pool


def math_reward_fn(response: str, gold: Any) -> float:
    """1.0 if the final answer in ``response`` equals ``gold``, else 0.0 (timeouts: 0.0)."""
    try:
        return float(default_pool().verify(response, gold))
    except VerifierError as e:
        log.warning("math verifier: %s; scoring 0", e)
        return 0.0


async def amath_reward_fn(response: str, gold: Any) -> float:
    """``math_reward_fn`` for async code: waits on the pool without blocking the event loop."""
    try:
        return float(await default_pool().averify(response, gold))
    except VerifierError as e:
        log.warning("math verifier: %s; scoring 0", e)
        return 0.0

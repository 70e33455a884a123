"""The math verifier: is a model's final answer equal to the gold answer?

What it is: answer extraction (the last ``\\boxed{}``/``\\fbox{}``, or failing that a final-
answer line such as ``The answer is 18`` or ``#### 18``), comparison with ``math-verify``
(symbolic and numeric equality of LaTeX or plain answers), and ``VerifierPool``: worker
processes that can be killed on a hard timeout (math-verify's own timeout uses
``signal.alarm``, which only works on a main thread) and are recycled after a number of
tasks (sympy's caches grow). ``averify`` never blocks the event loop. What it is not: a
grader of reasoning or of free-text answers.

Deliberate decisions where plain math-verify is too lenient or ambiguous (each has a test in
tests/envs/test_math_verifier.py):

* **No anchor, no answer.** math-verify alone would pick *any* number in a reply ("5 or 18"
  matches a gold 18). We grade only the last box, else the last final-answer line; a reply
  with neither scores 0.
* **Unbracketed lists are ordered.** math-verify reads ``1, 2`` as the set {1, 2}, so
  ``2, 1`` would match. A gold written ``1, 2`` is compared item by item, in order (the
  reply may add brackets: ``(1, 2)``). Write the gold as a set, ``\\{1, 2\\}``, to accept
  any order.
* **A percent sign is a unit.** ``10%`` matches ``10`` in both directions, and ``0.1`` (the
  same quantity): GSM8K writes the golds of "what percent" questions bare, so rejecting
  ``\\boxed{25\\%}`` for gold 25 would mark right answers wrong. A bare number and its
  hundredth never match (gold ``10`` vs ``0.1`` scores 0).
* **Hedged boxes fail.** ``\\boxed{18 \\text{ or } 20}`` is a set of two answers, never
  equal to one gold number.
* **Verifier timeouts score 0** (``math_reward_fn``): a reply that makes the verifier hang
  earns nothing; the pool counts it in ``stats["timeouts"]``.

Main hooks::

    math_reward_fn(response, gold) -> float          # 1.0 or 0.0, shared default pool
    await amath_reward_fn(response, gold)            # the same, awaitable
    pool = VerifierPool(VerifierConfig(workers=2))   # an explicit pool; close() it
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import json
import logging
import os
import queue
import re
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from agentrl.config import option
from agentrl.errors import VerifierError

log = logging.getLogger(__name__)

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The folder that holds the ``envs`` package (put on the workers' PYTHONPATH)."""

# --------------------------------------------------------------------------- extraction


def _braced(text: str, open_at: int) -> str | None:
    """The text inside the brace group that opens at ``text[open_at] == '{'``."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
    return None


_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_LINE = re.compile(
    r"(?:^|\n)[ \t>*#_]*(?:####|(?:the\s+)?final\s+answer|(?:the\s+)?answer)\s*(?:is|:|=)?\s*[:=]?\s*(.+)",
    re.IGNORECASE,
)
_NUMBER_THEN_WORDS = re.compile(r"^(?:\\?\$)?\s*([-+]?\d[\d,]*(?:\.\d+)?\s*\\?%?)\s*(?:[A-Za-z][A-Za-z .]*)?$")


def extract_final_answer(response: str) -> str | None:
    """The answer a reply commits to: the last box, else the last final-answer line, else None."""
    boxes = [m for m in _BOX.finditer(response)]
    for m in reversed(boxes):
        inner = _braced(response, m.end() - 1)
        if inner is not None and inner.strip():
            return inner.strip()
    lines = _ANSWER_LINE.findall(response)
    if lines:
        return _clean(lines[-1]) or None
    return None


def _clean(text: str) -> str:
    text = text.strip().strip("*").strip()
    text = re.sub(r"^\$+|\$+$", "", text).strip()
    text = re.sub(r"^\\\(|\\\)$", "", text).strip()
    text = text.rstrip(".;!").strip()
    match = _NUMBER_THEN_WORDS.match(text)
    return match.group(1).strip() if match else text


def normalize_gold(gold: Any) -> str:
    """The gold answer as text: GSM8K's ``... #### 18`` -> ``18``; 27.0 -> ``27``."""
    if isinstance(gold, bool) or gold is None:
        raise VerifierError(f"a gold answer is a string or a number, got {gold!r}")
    if isinstance(gold, float):
        return str(int(gold)) if gold.is_integer() else repr(gold)
    if isinstance(gold, int):
        return str(gold)
    text = str(gold)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    text = text.strip()
    boxed = extract_final_answer(text) if _BOX.search(text) else None
    text = (boxed or text).strip().strip("$").strip()
    if not text:
        raise VerifierError(f"gold answer {gold!r} is empty after normalization")
    return text


# --------------------------------------------------------------------------- comparison (in a worker)


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0 and not text[max(0, i - 1) : i + 1].endswith("{,"):
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [s.strip() for s in items]


def _unwrap(text: str) -> str:
    text = text.strip()
    for left, right in (("\\left(", "\\right)"), ("\\left[", "\\right]"), ("\\{", "\\}"), ("(", ")"), ("[", "]")):
        if text.startswith(left) and text.endswith(right):
            return text[len(left) : -len(right)].strip()
    return text


_GOLD_CACHE: dict[str, Any] = {}


def _parse(text: str, timeout_s: int) -> Any:
    from math_verify import parse

    return parse(f"${text}$", parsing_timeout=timeout_s)


def _parse_gold(text: str, timeout_s: int) -> Any:
    if text not in _GOLD_CACHE:
        if len(_GOLD_CACHE) > 4096:
            _GOLD_CACHE.clear()
        _GOLD_CACHE[text] = _parse(text, timeout_s)
    return _GOLD_CACHE[text]


def _is_unordered_list(parsed: Any, text: str) -> bool:
    """math-verify read ``text`` as a set although it was written without set braces."""
    import sympy

    return bool(parsed) and isinstance(parsed[0], sympy.FiniteSet) and not text.lstrip().startswith(("\\{", "\\left\\{"))


def compare(answer: str, gold: str, timeout_s: int = 3) -> bool:
    """Whether the extracted ``answer`` equals the normalized ``gold`` (the rules above)."""
    from math_verify import verify

    answer = re.sub(r"(?<!\\)\$", "", answer).strip()
    gold_parsed = _parse_gold(gold, timeout_s)
    if not gold_parsed:
        raise VerifierError(f"math-verify cannot read the gold answer {gold!r}")
    if _is_unordered_list(gold_parsed, gold):
        gold_items = _split_top_level(gold)
        answer_items = _split_top_level(_unwrap(answer))
        if len(gold_items) != len(answer_items):
            return False
        return all(compare(a, g, timeout_s) for a, g in zip(answer_items, gold_items, strict=True))
    answer_parsed = _parse(answer, timeout_s)
    if not answer_parsed:
        return False
    return bool(verify(gold_parsed, answer_parsed, timeout_seconds=timeout_s))


def _worker_main() -> None:
    """A verifier worker (``python -c``): reads JSON lines ``[answer, gold]`` on stdin and
    answers ``["ok", bool]`` or ``["error", message]`` on the original stdout."""
    import resource

    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # anything printed by libraries goes to stderr, never into the protocol
    limit_mb = int(os.environ.get("AGENTRL_VERIFIER_MEMORY_MB", "0"))
    if limit_mb:
        resource.setrlimit(resource.RLIMIT_AS, (limit_mb << 20, limit_mb << 20))
    soft_timeout_s = int(os.environ.get("AGENTRL_VERIFIER_SOFT_TIMEOUT_S", "3"))
    import math_verify  # noqa: F401  (imported before the first task, not during it)

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    for line in sys.stdin:
        answer, gold = json.loads(line)
        try:
            reply: list[Any] = ["ok", compare(answer, gold, soft_timeout_s)]
        except VerifierError as e:
            reply = ["error", str(e)]
        except Exception as e:
            reply = ["error", f"{type(e).__name__}: {e}"]
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()


# --------------------------------------------------------------------------- the pool


@dataclass
class VerifierConfig:
    """How the verifier pool runs."""

    workers: int = option(2, help="worker processes (each verifies one answer at a time)", ge=1)
    hard_timeout_s: float = option(10.0, help="a verification running longer is killed with its worker", gt=0)
    soft_timeout_s: int = option(3, help="math-verify's own parse/verify timeout inside a worker", ge=1)
    max_tasks_per_worker: int = option(5000, help="a worker is replaced after this many tasks", ge=1)
    memory_limit_mb: int = option(4096, help="address-space limit of a worker (0: none)", ge=0)
    max_wait_s: float = option(120.0, help="longest an averify call waits, queueing included", gt=0)


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

    def request(self, answer: str, gold: str, timeout_s: float) -> list[Any]:
        """Send one job and wait for its reply; TimeoutError after ``timeout_s``, EOFError if
        the worker died."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps([answer, gold]) + "\n").encode())
        self.proc.stdin.flush()
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
        answer = extract_final_answer(response)
        if answer is None:
            return False
        fut = self.submit(answer, normalize_gold(gold))
        try:
            return fut.result(timeout=self.cfg.max_wait_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise VerifierError(f"verification waited more than {self.cfg.max_wait_s:g} s in the queue") from None

    async def averify(self, response: str, gold: Any) -> bool:
        """Whether ``response`` answers ``gold``; raises VerifierError on a timeout or crash."""
        answer = extract_final_answer(response)
        if answer is None:
            return False
        fut = self.submit(answer, normalize_gold(gold))
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), self.cfg.max_wait_s)
        except TimeoutError:
            fut.cancel()
            raise VerifierError(f"verification waited more than {self.cfg.max_wait_s:g} s in the queue") from None

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

    def _dispatch(self) -> None:
        worker: _Worker | None = None
        try:
            while True:
                job = self._jobs.get()
                if job is None:
                    return
                fut, answer, gold = job
                if not fut.set_running_or_notify_cancel():
                    continue
                if worker is not None and worker.tasks >= self.cfg.max_tasks_per_worker:
                    worker.stop()
                    worker = None
                    self._count("restarts")
                try:
                    if worker is None:
                        worker = _Worker(self.cfg)
                    worker.tasks += 1
                    kind, value = worker.request(answer, gold, self.cfg.hard_timeout_s)
                except TimeoutError:
                    worker.kill()
                    worker = None
                    self._count("timeouts")
                    fut.set_exception(VerifierError(
                        f"verifying {answer[:80]!r} against {gold[:80]!r} took more than "
                        f"{self.cfg.hard_timeout_s:g} s; the worker was killed"))
                    continue
                except (EOFError, OSError, ValueError) as e:
                    if worker is not None:
                        worker.kill()
                    worker = None
                    self._count("errors")
                    fut.set_exception(VerifierError(f"a verifier worker failed ({type(e).__name__}: {e}); "
                                                    "it was replaced"))
                    continue
                if kind == "ok":
                    self._count("verified")
                    fut.set_result(bool(value))
                else:
                    self._count("errors")
                    fut.set_exception(VerifierError(value))
        finally:
            if worker is not None:
                worker.stop()


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

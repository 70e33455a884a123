"""The rollout side of a training run: in rank 0's event loop, or in a process of its own.

What it is: the two homes of what rank 0 drives each step — the rollout executor, its workflow,
environments and episode log, and the inference client its episodes generate with:

- ``LocalRollout``: in rank 0's process, on the event loop that also schedules the steps. What
  needs the executor itself runs here: deterministic mode (the lockstep clock), the gateway's
  agents (``rollout.source: gateway``) and recorded steps.
- ``RolloutProcess``: the same ``LocalRollout`` in a child of rank 0
  (``python -m agentrl.run.rollout_side RUN_DIR FD``), driven over a socket pair. The child has a
  ``RemoteEngine`` of its own, which follows the publisher's (``RemoteEngine.policy`` / ``follow``,
  sent with every ``set_version``); servers hold the requests it sends while they are paused.
  Why a process: rank 0's trainer thread and the episodes' Python would otherwise share one
  interpreter lock, and every step of the update waits on it (DESIGN.md §4, "Rollout process").

Both answer the same calls: ``open``, ``start``, ``next_batch``, ``set_version``,
``pause_admission`` / ``resume_admission`` (the weight publisher's hooks), ``snapshot`` (the step's
rollout metrics), ``checkpoint_state``, ``forget`` (groups trained on and checkpointed), ``stop``
and ``aclose``. ``agentrl.run.run_config.apply_rollout_worker`` resolves ``rollout.worker: auto``.

What it is not: the executor (``agentrl.rollout.executor``) or the loop that schedules the steps
(``agentrl.run.loop``). Main hooks: ``LocalRollout(cfg, run_dir)``, ``RolloutProcess.spawn(run_dir)``.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from agentrl.errors import RolloutError

log = logging.getLogger(__name__)

CALLS = frozenset({"open", "start", "next_batch", "set_version", "pause_admission", "resume_admission", "snapshot",
                   "checkpoint_state", "forget", "stop", "aclose"})
"""What rank 0 may ask the rollout process (``LocalRollout``'s methods of those names)."""


class LocalRollout:
    """The rollout side in this process (see the module doc). ``LocalRollout(cfg, run_dir)``
    builds what needs no server (the rows, the workflow); ``open`` the rest."""

    def __init__(self, cfg: Any, run_dir: Path) -> None:
        from agentrl.run.run_config import build_workflow, dataset_rows

        self.cfg, self.run_dir = cfg, run_dir
        self.recorded = self.workflow = self.rows = None
        self.external = cfg.rollout.source == "gateway"
        if cfg.rollout.recorded is not None:  # off-policy: the recorded run's steps are this run's batches
            from agentrl.rollout.recorded import RecordedEpisodes, model_vocab_size

            self.recorded = RecordedEpisodes(cfg.rollout.recorded, model_vocab_size(cfg.model))
        elif not self.external:  # the rows first: a dataset's module may register the environment the workflow makes
            from agentrl.rollout.executor import RowSource

            self.rows = RowSource(dataset_rows(cfg.rollout.dataset, cfg.seed), seed=cfg.seed,
                                  shuffle=cfg.rollout.shuffle)
            self.workflow = build_workflow(cfg, cfg.rollout.sampling)
        self.engine: Any = None
        self.executor: Any = None
        self.episode_log: Any = None
        self.lockstep: Any = None
        self._owns_engine = False
        self._handed: deque[list] = deque()  # the groups of batches handed out and not yet trained on

    async def open(self, engine: Any, version: int, resume_from: str | None, *,
                   owns_engine: bool = False) -> dict[str, int]:
        """Build the executor over ``engine`` at trainer ``version`` (restored from the checkpoint at
        ``resume_from``, if any); returns the groups a resume finishes first and the logged
        episodes it replays (``pending``, ``logged``)."""
        from agentrl.rollout.executor import EpisodeKey, RolloutExecutor
        from agentrl.rollout.journal import EpisodeLog

        cfg = self.cfg
        self.engine, self._owns_engine = engine, owns_engine
        state = json.loads((Path(resume_from) / "rollout.json").read_text()) if resume_from else None
        keep = None
        if state is not None:
            pending = {int(i) for i in state["pending"]}
            cursor = state["cursor"]

            def keep(key: str) -> bool:  # the episodes of rows still to be trained on
                index = EpisodeKey.parse(key).index
                return index in pending or index >= cursor
        self.episode_log = EpisodeLog(self.run_dir / "rollout" / "episodes.jsonl", keep=keep)
        if cfg.deterministic and self.workflow is not None:
            from agentrl.rollout.lockstep import Lockstep

            self.lockstep = Lockstep(cfg.rollout.lockstep)  # (the launcher checked that the servers are batch-invariant)
        self.executor = RolloutExecutor(self.workflow, engine, self.rows, group_size=cfg.rollout.group_size,
                                        batch_size=cfg.rollout.batch_size, max_staleness=cfg.trainer.max_staleness,
                                        max_concurrent=cfg.rollout.max_concurrent,
                                        filter_equal_rewards=cfg.rollout.filter_equal_rewards,
                                        episode_log=self.episode_log, run_id=self.run_dir.name,
                                        record_max_bytes=cfg.logging.record_max_bytes, lockstep=self.lockstep)
        if state is not None:
            self.executor.restore(state, version)
        else:
            self.executor.version = version
        return {"pending": len(state["pending"]) if state is not None else 0, "logged": len(self.episode_log.keys())}

    async def start(self) -> None:
        await self.executor.start()

    async def next_batch(self) -> Any:
        batch = await self.executor.next_batch()
        self._handed.append(batch.groups)
        return batch

    def set_version(self, version: int, policy: dict[str, Any] | None = None) -> None:
        """The trainer trained on the oldest batch handed out and reached ``version``; ``policy``:
        the publisher's ``RemoteEngine.policy()``, when this side's engine is not the publisher's."""
        if policy is not None:
            self.engine.follow(policy)
        if self._handed:
            self._handed.popleft()
        self.executor.set_version(version)

    async def pause_admission(self) -> None:
        await self.executor.pause_admission()

    async def resume_admission(self) -> None:
        await self.executor.resume_admission()

    async def snapshot(self) -> dict[str, Any]:
        """The rollout's metrics now (``metrics``), generation's busy seconds so far (``busy_s``),
        and whether a server came back without broadcast weights (``needs_rejoin``)."""
        from agentrl.plugins import sandbox_counters

        ex = self.executor
        return {"metrics": {"rollout/groups_running": float(ex.running), "rollout/groups_ready": float(ex.ready),
                            **{f"rollout/{k}": float(v) for k, v in ex.counters.items()},
                            **{f"sandbox/{k}": float(v) for k, v in sandbox_counters().items()}},
                "busy_s": ex.generation_busy_s(), "needs_rejoin": bool(getattr(self.engine, "needs_rejoin", False))}

    async def checkpoint_state(self) -> dict[str, Any]:
        """The executor's ``state()``, a batch handed out but not trained on still pending in it."""
        return self.executor.state([g for groups in self._handed for g in groups])

    async def forget(self, indices: list[int]) -> None:
        """The groups of rows ``indices`` were trained on and checkpointed: the episode log drops
        their episodes (a resume never needs them again) and compacts."""
        size = self.executor.group_size
        self.episode_log.forget([f"{i}:{k}" for i in indices for k in range(size)])
        self.episode_log.compact()

    async def stop(self) -> None:
        if self.executor is not None:
            await self.executor.stop()

    async def aclose(self) -> dict[str, Any]:
        """Stop, close the log and the workflow (and the engine, if this side made it); returns the
        executor's counters and this process's sandbox counters (``counters``, ``sandbox``)."""
        from agentrl.plugins import sandbox_counters

        await self.stop()
        if self.episode_log is not None:
            self.episode_log.close()
        if self._owns_engine and self.engine is not None:
            await self.engine.aclose()
        if self.workflow is not None and hasattr(self.workflow, "aclose"):
            await self.workflow.aclose()
        return {"counters": dict(self.executor.counters) if self.executor is not None else {},
                "sandbox": dict(sandbox_counters())}


class RolloutProcess:
    """A ``LocalRollout`` in a child process of rank 0, with the same calls (see the module doc).

    ``spawn`` starts the child at once, so its imports and workflow overlap the trainer's model
    loading; ``open`` (on the run's event loop) waits for it. A call the child fails raises its
    exception here; a child that exits fails every call with a ``RolloutError`` naming its exit
    code. The child dies with rank 0 (the parent-death signal) and exits when the socket closes.
    """

    def __init__(self, proc: subprocess.Popen, conn: Connection) -> None:
        self.proc, self._conn = proc, conn
        self._ids = itertools.count()
        self._waiting: dict[int, asyncio.Future] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gone: RolloutError | None = None
        self._next: asyncio.Future | None = None  # the next batch, asked for ahead
        self._closing = False

    @classmethod
    def spawn(cls, run_dir: Path) -> RolloutProcess:
        from agentrl.process.services import die_with_parent

        ours, theirs = socket.socketpair()
        with theirs:
            proc = subprocess.Popen([sys.executable, "-m", __name__, str(run_dir), str(theirs.fileno())],
                                    pass_fds=(theirs.fileno(),), stdout=sys.stderr.fileno(),
                                    preexec_fn=die_with_parent(signal.SIGKILL))
        return cls(proc, Connection(ours.detach()))

    async def open(self, servers: dict[str, Any], version: int, resume_from: str | None) -> dict[str, int]:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._conn.fileno(), self._readable)
        os.set_blocking(self._conn.fileno(), True)  # (uvloop made it non-blocking) a message goes out whole
        return await self._call("open", servers=servers, version=version, resume_from=resume_from)

    async def start(self) -> None:
        await self._call("start")

    async def next_batch(self) -> Any:
        """The next batch, asked for before this one is returned: it is formed, pickled and sent
        while the trainer trains on this one (its ``wait_s`` is the time waited here)."""
        t0 = time.perf_counter()
        if self._next is None:
            self._next = self._ask("next_batch")
        try:
            batch = await self._next
        finally:
            self._next = None
        batch.wait_s = time.perf_counter() - t0
        self._next = self._ask("next_batch")
        self._next.add_done_callback(_retrieved)  # (a run that stops never awaits the last one)
        return batch

    def set_version(self, version: int, policy: dict[str, Any] | None = None) -> None:
        self._send((None, "set_version", {"version": version, "policy": policy}))

    async def pause_admission(self) -> None:
        await self._call("pause_admission")

    async def resume_admission(self) -> None:
        await self._call("resume_admission")

    async def snapshot(self) -> dict[str, Any]:
        return await self._call("snapshot")

    async def checkpoint_state(self) -> dict[str, Any]:
        return await self._call("checkpoint_state")

    async def forget(self, indices: list[int]) -> None:
        await self._call("forget", indices=indices)

    async def stop(self) -> None:
        if self._gone is None:
            await self._call("stop")

    async def aclose(self) -> dict[str, Any]:
        """The child's ``LocalRollout.aclose()``, then its exit (killed if it does not exit)."""
        self._closing = True
        try:
            if self._gone is None:
                return await self._call("aclose")
            return {"counters": {}, "sandbox": {}}
        finally:
            self._close()
            try:
                await asyncio.to_thread(self.proc.wait, 30)
            except subprocess.TimeoutExpired:
                log.warning("the rollout process (pid %d) did not exit; killing it", self.proc.pid)
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait)

    # ------------------------------------------------------------------ the socket

    async def _call(self, op: str, **kwargs: Any) -> Any:
        return await self._ask(op, **kwargs)

    def _ask(self, op: str, **kwargs: Any) -> asyncio.Future:
        if self._gone is not None:
            raise self._gone
        rid = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._waiting[rid] = future
        self._send((rid, op, kwargs))
        return future

    def _send(self, message: tuple) -> None:
        if self._gone is not None:
            raise self._gone
        try:
            self._conn.send(message)
        except OSError:
            self._lost()
            raise self._gone from None

    def _readable(self) -> None:
        try:
            while self._conn.poll():
                rid, ok, value = self._conn.recv()
                future = self._waiting.pop(rid, None)
                if future is not None and not future.done():
                    future.set_result(value) if ok else future.set_exception(value)
        except (EOFError, OSError):
            self._lost()

    def _lost(self) -> None:
        """The child is gone: every call waiting, and every later one, fails saying so."""
        try:  # the error names the exit code (the exit follows the socket's close)
            code = self.proc.poll() if self._closing else self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            code = None
        self._gone = RolloutError(f"the rollout process (pid {self.proc.pid}) exited"
                                  + (f" with code {code}" if code is not None else "")
                                  + "; its last words are above in this rank's log")
        self._close()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(self._gone)
        self._waiting.clear()

    def _close(self) -> None:
        if self._loop is not None and not self._conn.closed:
            self._loop.remove_reader(self._conn.fileno())
        if not self._conn.closed:
            self._conn.close()


def _retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


# ---------------------------------------------------------------------- the child


def _portable(e: BaseException) -> BaseException:
    """``e`` if it survives pickling, else a ``RolloutError`` that says what it was."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RolloutError(f"{type(e).__name__}: {e}")


async def _serve(side: LocalRollout, conn: Connection) -> None:
    """Answer rank 0's calls until ``aclose`` (or until the socket closes: rank 0 is gone)."""
    from agentrl.client.remote_engine import RemoteEngine

    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[tuple | None] = asyncio.Queue()

    def readable() -> None:
        try:
            while conn.poll():
                inbox.put_nowait(conn.recv())
        except (EOFError, OSError):
            loop.remove_reader(conn.fileno())
            inbox.put_nowait(None)

    def reply(rid: int | None, ok: bool, value: Any) -> None:
        if rid is not None:
            with_error = value if ok else _portable(value)
            try:
                conn.send((rid, ok, with_error))
            except OSError:  # rank 0 is gone: the inbox ends next
                pass
            except Exception as e:  # the answer does not pickle: rank 0 hears why
                log.exception("rollout process: the answer to a call does not pickle")
                conn.send((rid, False, RolloutError(f"the rollout process's answer could not be sent: {e!r}")))

    async def handle(rid: int | None, op: str, kwargs: dict[str, Any]) -> None:
        try:
            if op == "open":
                servers = kwargs["servers"]
                engine = RemoteEngine(servers["servers"], side.cfg.inference.client, router=servers.get("router"),
                                      version=kwargs["version"])
                value = await side.open(engine, kwargs["version"], kwargs["resume_from"], owns_engine=True)
                gc.freeze()  # what the run keeps (the executor, its client) stays out of the full passes
            else:
                value = getattr(side, op)(**kwargs)
                if asyncio.iscoroutine(value):
                    value = await value
        except Exception as e:
            if rid is None:
                log.exception("rollout process: %s failed", op)
            reply(rid, False, e)
        else:
            reply(rid, True, value)

    loop.add_reader(conn.fileno(), readable)
    os.set_blocking(conn.fileno(), True)  # (uvloop made it non-blocking) a batch goes out whole
    tasks: set[asyncio.Task] = set()
    message: tuple | None = None
    try:
        while (message := await inbox.get()) is not None:
            rid, op, kwargs = message
            if op not in CALLS:
                reply(rid, False, RolloutError(f"the rollout process has no call {op!r}; it has {sorted(CALLS)}"))
                continue
            if op == "aclose":
                await handle(rid, op, kwargs)
                return
            task = asyncio.create_task(handle(rid, op, kwargs), name=f"rollout-{op}")
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    finally:
        for task in tasks:
            task.cancel()
        if message is None:  # rank 0 left without closing: nothing more will be asked
            await side.aclose()
        conn.close()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m agentrl.run.rollout_side RUN_DIR FD   (started by agentrl train's rank 0)",
              file=sys.stderr)
        return 2
    from agentrl.config import load_config
    from agentrl.process.services import run_async
    from agentrl.run.run_config import RunConfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the launcher's to handle
    run_dir, conn = Path(args[0]), Connection(int(args[1]))
    cfg = load_config(RunConfig, run_dir / "config.yaml")
    side = LocalRollout(cfg, run_dir)
    run_async(_serve(side, conn))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""EnvPool: environments of one id, built once and reused across episodes.

What it is: a free list of ``gymnasium`` environments for workflows that play hundreds of
episodes at once. ``async with pool.lease() as env`` hands out an idle env (or builds one,
in a worker thread: construction imports modules and reads datasets), and takes it back
when the block ends; each episode starts with ``reset``, which is all a Gymnasium env needs
to begin afresh. An episode that raised or was cancelled does not give its env back: the env
is closed and the next lease builds a new one, so a half-finished turn never leaks into
another episode. The pool grows to the peak number of concurrent episodes and keeps at most
``max_idle`` envs.

``reset``/``step`` use the env's coroutines (``areset``/``astep``, which every
``agentrl.env.TextEnv`` has) and otherwise run the sync calls in a bounded thread pool; each
call has a timeout. Both note what went in and came out into the running episode's record
(``agentrl.rollout.record``), when one is open. The rollout side reaches the env class itself (``env.unwrapped``):
Gymnasium's wrappers do not forward ``areset``/``astep``, and TextEnv enforces its own limits.

What it is not: an episode loop (the workflows in ``workflows/``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agentrl.api import Message
from agentrl.errors import ConfigError, EnvError
from agentrl.plugins import find_env
from agentrl.rollout.record import current_record

log = logging.getLogger(__name__)

_sync_calls: ThreadPoolExecutor | None = None


def _executor() -> ThreadPoolExecutor:
    global _sync_calls
    if _sync_calls is None:
        _sync_calls = ThreadPoolExecutor(max_workers=32, thread_name_prefix="env-sync")
    return _sync_calls


class EnvPool:
    """Reusable environments of ``env_id`` built with ``env_kwargs``; see the module docstring."""

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any] | None = None, *, max_idle: int = 256,
                 call_timeout_s: float = 600.0) -> None:
        try:
            self.env_id = find_env(env_id)
        except ConfigError as e:
            raise EnvError(str(e)) from e
        self.env_kwargs = dict(env_kwargs or {})
        self.max_idle = max_idle
        self.call_timeout_s = call_timeout_s
        self.built = 0  # envs constructed so far (a measure of reuse)
        self._idle: list[Any] = []
        self._closed = False

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[Any]:
        """An env for one episode; returned to the pool when the block ends without an exception."""
        if self._closed:
            raise EnvError(f"the {self.env_id} pool is closed")
        env = self._idle.pop() if self._idle else await self._build()
        healthy = False
        try:
            yield env
            healthy = True
        finally:
            if healthy and not self._closed and len(self._idle) < self.max_idle:
                self._idle.append(env)
            else:
                await _close(env)

    async def _build(self) -> Any:
        import gymnasium

        def build() -> Any:
            try:
                return gymnasium.make(self.env_id, disable_env_checker=True, **self.env_kwargs).unwrapped
            except TypeError as e:  # a wrong keyword argument
                raise EnvError(f"cannot build {self.env_id} with {self.env_kwargs}: {e}") from e

        env = await asyncio.to_thread(build)
        self.built += 1
        return env

    async def reset(self, env: Any, task: Mapping[str, Any] | None) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode on ``task`` (a dataset row); returns the opening messages and info."""
        options = {"task": dict(task)} if task is not None else None
        async with asyncio.timeout(self.call_timeout_s):
            if hasattr(env, "areset"):
                obs, info = await env.areset(options=options)
            else:
                obs, info = await asyncio.get_running_loop().run_in_executor(
                    _executor(), lambda: env.reset(options=options))
        record = current_record()
        if record is not None:
            record.reset(task, obs, info)
        return obs, info

    async def step(self, env: Any, action: str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """One reply of the model; Gymnasium's five-tuple."""
        async with asyncio.timeout(self.call_timeout_s):
            if hasattr(env, "astep"):
                out = await env.astep(action)
            else:
                out = await asyncio.get_running_loop().run_in_executor(_executor(), env.step, action)
        record = current_record()
        if record is not None:
            record.step(action, *out)
        return out

    async def aclose(self) -> None:
        """Close every idle env; envs on lease are closed when they come back."""
        self._closed = True
        idle, self._idle = self._idle, []
        await asyncio.gather(*(_close(env) for env in idle))


async def _close(env: Any) -> None:
    try:
        async with asyncio.timeout(60):
            if hasattr(env, "aclose"):
                await env.aclose()
            await asyncio.get_running_loop().run_in_executor(_executor(), env.close)
    except Exception as e:  # closing is best effort; the env is dropped either way
        log.warning("closing %s failed: %r", type(env).__name__, e)

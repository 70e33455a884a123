"""Gateway and Session: the episodes an OpenAI-compatible gateway records, one session each.

What it is: the gateway's state without HTTP (``agentrl.rollout.gateway_routes`` serves it). A
``Session`` is one episode: its secret key, metadata and ``ChatClient`` (which records every
call's exact tokens). The ``Gateway`` opens sessions, finds them by key, ends them — exporting
their trajectories as JSON lines to ``OUT/trajectories.jsonl`` and handing them to the
``on_episode`` hook — and ends sessions idle past ``session_timeout_s`` as failed data
(status ``timeout``, tokens kept, counted), never dropping one silently. ``admission``, the one gate,
decides whether a new session may open (the HTTP side answers 429 with ``Retry-After`` when
not): a training loop sets its staleness bound there.

Its settings are a ``GatewayConfig`` (``agentrl.rollout.gateway_config``). In a training run
(in-process)::

    gateway = Gateway(engine, "examples/tiny-model", cfg.gateway, on_episode=queue_put)   # sync or async hook
    session = gateway.open_session(metadata={"row": row})   # or POST /v1/sessions over HTTP
    ... the agent calls the gateway with session.key ...
    trajectories = await gateway.end_session(session.id)

A session whose last generation call failed for good (every upstream down) ends as failed
data with status ``inference_error``; a retry that succeeds clears that, since a failed call
records nothing.

Abandoned calls are not data. ``call(session, route, deliver)`` hands the answer to its client
while the call still counts as in flight; when ``deliver`` says the client was gone before the
answer went out (it hung up or timed out during generation, or cut a stream), the call is
abandoned: ``TokenConversation.abandon`` takes its completion and the prompt tokens it added
out of the session, as if it had never been made, and counts it (``stats["calls_abandoned"]``,
the session's summary, ``metrics["calls_abandoned"]`` on its trajectories). So a completion no
client received is never exported — not as an ``ok`` reward-0 sample beside the episode's real
one (GRPO averages the trajectories of an episode), and not as a failed trajectory either — and
the client's next call extends the conversation it actually saw, in place, with the same
tokens. A call whose answer could not even be built (the chat client takes it back before it
raises) is counted the same way. A session whose every call was abandoned ends with no trajectory (an executor counts
such an episode as failed). What it is not: authentication or HTTP (``gateway_routes``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import logging
import secrets
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.api import InferenceClient, Trajectory, TrajectoryStatus
from agentrl.config import check_options
from agentrl.errors import RolloutError, ServerError, ServerUnavailable
from agentrl.rollout.chat_client import ChatClient
from agentrl.rollout.conversation import ExportStyle
from agentrl.rollout.gateway_config import GatewayConfig
from agentrl.rollout.gateway_mcp import SessionTools
from agentrl.rollout.renderer import ChatRenderer

log = logging.getLogger(__name__)

RECORDINGS = "trajectories.jsonl"
"""``OUT/trajectories.jsonl``: the ended sessions' trajectories, one JSON object a line
(``Trajectory.to_dict()`` plus ``session_id`` and ``metadata``)."""

EpisodeHook = Callable[[list[Trajectory], "Session"], Awaitable[None] | None]
Stepper = Callable[[str], Awaitable[dict[str, Any]]]


@dataclass(eq=False)
class Session:
    """One episode: its key, metadata, recorded calls and how it ended."""

    id: str
    key: str
    metadata: dict[str, Any]
    chat: ChatClient
    created: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    inflight: int = 0
    failure: tuple[TrajectoryStatus, str] | None = None  # the last call failed for good
    stepper: Stepper | None = None  # an env the agent steps through the gateway (ExternalAgentWorkflow)
    tools: SessionTools | None = None  # the env's tools, served at /sessions/{id}/mcp (agentrl.rollout.gateway_mcp)
    ended: bool = False
    status: str = "open"
    trajectories: list[Trajectory] = field(default_factory=list)
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    def summary(self) -> dict[str, Any]:
        conv = self.chat.conversation
        return {"session_id": self.id, "status": self.status, "calls": len(conv.calls),
                "calls_in_flight": self.inflight, "calls_abandoned": conv.abandoned, "tokens": conv.num_tokens,
                "metadata": self.metadata, "trajectories": len(self.trajectories)}


class Gateway:
    """Sessions over one engine and tokenizer; see the module docstring.

    Args:
        engine: the ``InferenceClient`` for sessions opened without their own (None: every
            session must bring one).
        tokenizer: model directory, tokenizer or ``ChatRenderer``.
        config: the settings (``GatewayConfig``; None: its defaults).
        out: folder for ``trajectories.jsonl`` (None: not written).
        on_episode: called with each ended session's trajectories.
        close_engine: ``aclose`` closes ``engine`` too (the gateway made it).
        **settings: ``GatewayConfig`` fields that replace ``config``'s
            (``Gateway(engine, tok, session_timeout_s=2.0)``).
    """

    def __init__(self, engine: InferenceClient | None, tokenizer: str | Path | Any,
                 config: GatewayConfig | None = None, *, out: str | Path | None = None,
                 on_episode: EpisodeHook | None = None, close_engine: bool = False, **settings: Any) -> None:
        self.config = dataclasses.replace(config or GatewayConfig(), **settings)
        check_options(self.config)
        self.engine = engine
        self.close_engine = close_engine
        self.renderer = tokenizer if isinstance(tokenizer, ChatRenderer) else ChatRenderer(tokenizer)
        self.out = Path(out) if out is not None else None
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
        self.on_episode = on_episode
        self.model = self.config.served_model_name or (
            str(tokenizer) if isinstance(tokenizer, (str, Path)) else "agentrl")
        """The model id sessions answer with (``served_model_name``, else the tokenizer's directory)."""
        self.admission: Callable[[Mapping[str, Any]], bool] | None = None
        """The one gate for new sessions: None admits every one (up to ``max_sessions``); a
        training loop sets its staleness bound here (``GatewayEpisodes.admits``)."""
        self.stats = {"sessions_opened": 0, "sessions_ended": 0, "sessions_timed_out": 0, "sessions_failed": 0,
                      "sessions_refused": 0, "completions": 0, "calls_abandoned": 0, "trajectories_written": 0}
        self._by_id: dict[str, Session] = {}
        self._by_key: dict[str, Session] = {}
        self._ended: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._write_lock = threading.Lock()
        self._reaper: asyncio.Task | None = None

    # ------------------------------------------------------------------ sessions

    def admits(self, metadata: Mapping[str, Any]) -> bool:
        """Whether a session with ``metadata`` may open now (``admission``'s answer). A True
        from a training run's predicate reserves the place: call this only to open the session."""
        return self.admission is None or self.admission(metadata)

    @property
    def open_sessions(self) -> int:
        return len(self._by_id)

    def open_session(self, metadata: Mapping[str, Any] | None = None, *, engine: InferenceClient | None = None,
                     stepper: Stepper | None = None, tools: SessionTools | None = None) -> Session:
        """A new session (its ``key`` is the agent's API key). Raises ``RolloutError`` when full."""
        if len(self._by_id) >= self.config.max_sessions:
            self.stats["sessions_refused"] += 1
            raise RolloutError(f"{len(self._by_id)} sessions are open, the most this gateway holds; end some first")
        engine = engine or self.engine
        if engine is None:
            raise RolloutError("this gateway has no default engine; open the session with engine=...")
        chat = ChatClient(engine, self.renderer, model=self.model, context_length=self.config.context_length,
                          default_max_tokens=self.config.default_max_tokens, max_tokens=self.config.max_session_tokens,
                          tool_call_parser=self.config.tool_call_parser,
                          reasoning_parser=self.config.reasoning_parser,
                          policy_sampling=self.config.agent_sampling == "policy")
        session = Session(f"sess_{uuid.uuid4().hex}", f"sk-agentrl-{secrets.token_urlsafe(24)}",
                          dict(metadata or {}), chat, stepper=stepper, tools=tools)
        session._idle.set()
        self._by_id[session.id] = session
        self._by_key[session.key] = session
        self.stats["sessions_opened"] += 1
        self._start_reaper()
        return session

    def by_key(self, key: str) -> Session | None:
        return self._by_key.get(key)

    def by_id(self, session_id: str) -> Session | None:
        return self._by_id.get(session_id)

    def ended_summary(self, session_id: str) -> dict[str, Any] | None:
        return self._ended.get(session_id)

    async def call(self, session: Session, route: Callable[[ChatClient], Awaitable[dict[str, Any]]],
                   deliver: Callable[[dict[str, Any]], Awaitable[bool]] | None = None) -> dict[str, Any]:
        """Run one generation call of ``session`` (``route(session.chat)``), keeping its bookkeeping.

        ``deliver(answer)``: sends the answer to its client while the call is still in flight
        (``end_session`` waits for it); False, or an exception, means the client never got it,
        and the call is abandoned (see the module docstring)."""
        if session.ended:
            raise RolloutError(f"session {session.id} has ended")
        session.inflight += 1
        session._idle.clear()
        session.last_used = time.monotonic()
        unanswered = session.chat.unanswered
        try:
            try:
                answer = await route(session.chat)
            except (ServerUnavailable, ServerError, TimeoutError) as e:  # not the request's fault: the episode's
                session.failure = (TrajectoryStatus.INFERENCE_ERROR, f"{type(e).__name__}: {e}"[:2000])
                raise
            finally:  # a call recorded and then taken back (its answer could not be built) went to no one
                self.stats["calls_abandoned"] += session.chat.unanswered - unanswered
            session.failure = None
            delivered = False
            try:
                delivered = deliver is None or await deliver(answer)
            finally:
                if delivered:
                    self.stats["completions"] += 1
                else:
                    self.abandon(session, answer["id"])
            return answer
        finally:
            session.inflight -= 1
            session.last_used = time.monotonic()
            if session.inflight == 0:
                session._idle.set()

    def abandon(self, session: Session, call_id: str) -> None:
        """Take back a call of ``session`` whose answer reached no client (the module docstring)."""
        if session.chat.conversation.abandon(call_id):
            self.stats["calls_abandoned"] += 1
            log.info("session %s: call %s abandoned by its client; taken out of the episode", session.id, call_id)
        else:
            log.warning("session %s: call %s was abandoned by its client, but a later call extends its text, so "
                        "it stays in the episode", session.id, call_id)

    async def end_session(self, session_id: str, *, discount: float | None = None, style: ExportStyle = "concat",
                          status: TrajectoryStatus | None = None, error: str = "") -> list[Trajectory]:
        """End a session: its trajectories (written and handed to ``on_episode``). Each call's
        reward becomes its return with ``discount`` (default ``config.discount``, 1: every segment
        of an agent that rewrote its history carries the episode's reward, not only the last).
        ``status`` marks them failed (the tokens are kept); a session whose last call failed is failed."""
        session = self._by_id.get(session_id)
        if session is None or session.ended:
            raise RolloutError(f"no open session {session_id!r}")
        session.ended = True
        try:
            async with asyncio.timeout(60):
                await session._idle.wait()  # calls in flight finish first
        except TimeoutError:
            log.warning("session %s ended with calls still in flight; they are not recorded", session_id)
        self._by_id.pop(session.id, None)
        self._by_key.pop(session.key, None)
        chat = session.chat
        chat.apply_reward_discount(self.config.discount if discount is None else discount)
        trajectories = chat.export_trajectories(style)
        if status is None and session.failure is not None:
            status, error = session.failure
        if status is not None and status is not TrajectoryStatus.OK:
            trajectories = trajectories or [Trajectory.failed(status)]
            for t in trajectories:
                t.status, t.error = status, error
            self.stats["sessions_timed_out" if status is TrajectoryStatus.TIMEOUT else "sessions_failed"] += 1
        for t in trajectories:
            t.episode_id = session.id
        session.trajectories = trajectories
        session.status = "ended" if status is None else status.value
        self.stats["sessions_ended"] += 1
        self._ended[session.id] = session.summary()
        while len(self._ended) > self.config.keep_ended:
            self._ended.popitem(last=False)
        await self._deliver(session, trajectories)
        return trajectories

    async def _deliver(self, session: Session, trajectories: list[Trajectory]) -> None:
        if self.out is not None and trajectories:
            lines = "".join(json.dumps({**t.to_dict(), "session_id": session.id, "metadata": session.metadata}) + "\n"
                            for t in trajectories)
            await asyncio.to_thread(self._append, lines)
            self.stats["trajectories_written"] += len(trajectories)
        if self.on_episode is not None:
            result = self.on_episode(trajectories, session)
            if inspect.isawaitable(result):
                await result

    def _append(self, lines: str) -> None:
        assert self.out is not None
        with self._write_lock, (self.out / RECORDINGS).open("a", encoding="utf-8") as f:
            f.write(lines)

    # ------------------------------------------------------------------ idle sessions

    def _start_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap(), name="gateway-session-reaper")

    async def _reap(self) -> None:
        timeout = self.config.session_timeout_s
        period = max(0.05, min(5.0, timeout / 4))
        while self._by_id:
            await asyncio.sleep(period)
            now = time.monotonic()
            for s in [s for s in self._by_id.values() if s.inflight == 0 and not s.ended
                      and now - s.last_used > timeout]:
                try:
                    await self.end_session(s.id, status=TrajectoryStatus.TIMEOUT,
                                           error=f"session idle for over {timeout} s")
                except Exception:  # one bad hook must not stop the reaper
                    log.exception("ending idle session %s failed", s.id)

    async def aclose(self, *, status: TrajectoryStatus = TrajectoryStatus.TIMEOUT) -> None:
        """End every open session as failed (``status``), then stop the reaper."""
        for s in list(self._by_id.values()):
            if not s.ended:
                await self.end_session(s.id, status=status, error="the gateway shut down before the session ended")
        if self._reaper is not None:
            self._reaper.cancel()
        if self.close_engine and self.engine is not None and hasattr(self.engine, "aclose"):
            await self.engine.aclose()

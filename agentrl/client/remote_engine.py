"""``RemoteEngine``: the trainer's and the rollout's client of the inference servers.

What it is: an ``agentrl.api.InferenceClient`` over HTTP to one or more servers of one engine:
SGLang's native API (SGLang 0.5.10-0.5.23, ``agentrl serve``: ``sglang_backend``) or vLLM's
token-in/token-out and RL routes (0.32+, ``vllm_backend``); ``RemoteEngineConfig.engine`` names
it (``engines.ENGINES``; ``auto``: asked of ``GET /v1/models``). The engine's backend owns its
wire format; this client owns what all share: routing, retries, probing, pausing, versions and
adapters by name. ``await generate(input_ids, sampling)`` returns a ``Completion``: the exact
tokens, their logprobs, the policy version of every token, the finish reason — interruption
hidden (an aborted request is resumed as prompt + tokens so far; ``ResumeLimit`` after
``max_resumes``). ``generate_group(input_ids, sampling, n)`` asks for ``n`` samples in one
request; ``prompt_logprobs(input_ids)`` scores tokens without generating (a teacher's). The
publishing side's calls (``pause()``, ``update_weights(path, version)``, ``resume()``, the
torch.distributed and LoRA-adapter calls) are its base ``publishing.WeightPublishing``'s.
Routing, retries, batching, the router and timeouts: DESIGN.md §4 "The client".

What it is not: a chat client (the OpenAI routes, ``agentrl.rollout.chat_client``), nor a load
balancer for clients other than itself. A stop string that straddles an interruption point is
not detected (the server only sees the output since the resume).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import httpx

from agentrl.api import Completion, SamplingParams
from agentrl.client.backend import EngineBackend, Sample, Servers
from agentrl.client.engines import AUTO, ENGINES, FALLBACK, detect
from agentrl.client.publishing import TRANSPORT_ERRORS, WeightPublishing
from agentrl.client.transport import KeepAliveTransport, Origin
from agentrl.config import option
from agentrl.errors import RequestRejected, ResumeLimit, ServerError, ServerUnavailable
from agentrl.http_edge import server_key
from agentrl.ids import unique_hex

log = logging.getLogger(__name__)


def base_url(address: str) -> str:
    """A server's address as given (``host:port`` or a URL) as the URL its routes hang from."""
    return address.rstrip("/") if "://" in address else f"http://{address.rstrip('/')}"


@dataclass
class RemoteEngineConfig:
    """How the client reaches and treats the inference servers (a run's ``inference.client``)."""

    engine: str = option(AUTO, choices=(AUTO, *ENGINES),
                         help="the servers' API: sglang or agentrl (SGLang's, which agentrl serve speaks), vllm "
                              "(vLLM's token-in/token-out and RL routes), auto: asked once from GET /v1/models "
                              "(owned_by)")
    timeout: float = option(600.0, help="seconds one generation call may take (incl. waiting out a pause)", gt=0)
    connect_timeout: float = option(5.0, help="seconds to open a connection", gt=0)
    control_timeout: float = option(300.0, help="seconds for pause/update/continue calls", gt=0)
    max_retries: int = option(3, help="retries in a row without progress before giving up", ge=0)
    backoff: float = option(0.25, help="first retry delay in seconds (doubles each retry)", ge=0)
    health_check_interval: float = option(2.0, help="seconds before a failed server is probed again", gt=0)
    max_resumes: int = option(1000, help="resumes of one interrupted request before giving up with ResumeLimit",
                              ge=0)
    batch_max_new_tokens: int = option(
        32, help="requests made in the same event-loop tick with at most this many new tokens share one "
        "/generate (each then waits for the slowest; 0: never share; SGLang's API only)", ge=0)


@dataclass
class _Server:
    address: str
    inflight: int = 0
    healthy: bool = True
    down_since: float = 0.0
    stale: bool = False  # answers, but lacks the weights last sent by broadcast: no generation until the next
    origin: Origin | None = field(init=False, repr=False)  # for KeepAliveTransport.post_json; plain http only

    def __post_init__(self) -> None:
        self.origin = Origin.of(self.address) if self.address.startswith("http://") else None


def _text(content: bytes) -> str:
    return content[:300].decode(errors="replace")


def _prompt(input_ids: Sequence[int]) -> list[int]:
    prompt = [int(t) for t in input_ids]
    if not prompt:
        raise RequestRejected("input_ids cannot be empty", 400)
    return prompt


class RemoteEngine(WeightPublishing):
    """Interruption-hiding, load-balancing client of one engine's servers (see the module docstring)."""

    def __init__(self, addresses: Sequence[str] | str, config: RemoteEngineConfig | None = None, *,
                 version: int = 0, router: str | None = None, transport: httpx.AsyncBaseTransport | None = None,
                 api_key: str | None = None, **settings: Any) -> None:
        """``settings`` override single fields of ``config`` (``RemoteEngine(url, timeout=30)``);
        ``api_key`` defaults to ``$AGENTRL_SERVE_API_KEY`` (``http_edge.server_key``)."""
        api_key = api_key if api_key is not None else server_key()
        if isinstance(addresses, str):
            addresses = [addresses]
        if not addresses:
            raise ValueError("RemoteEngine needs at least one server address, e.g. http://127.0.0.1:30000")
        unknown = sorted(set(settings) - {f.name for f in fields(RemoteEngineConfig)})
        if unknown:
            raise TypeError(f"RemoteEngine got unknown settings {unknown}; RemoteEngineConfig's fields are "
                            f"{[f.name for f in fields(RemoteEngineConfig)]}")
        self.config = config = replace(config or RemoteEngineConfig(), **settings)
        if config.engine != AUTO and config.engine not in ENGINES:
            raise ValueError(f"engine must be one of {[AUTO, *ENGINES]}, got {config.engine!r}")
        self._servers = [_Server(base_url(a)) for a in addresses]
        self._router = _Server(base_url(router)) if router else None
        self.timeout, self.control_timeout = config.timeout, config.control_timeout
        self.max_retries, self.backoff = config.max_retries, config.backoff
        self.health_check_interval, self.max_resumes = config.health_check_interval, config.max_resumes
        self._transport = transport or KeepAliveTransport()
        # /generate goes through the lean path of our own transport (no httpx objects per call)
        self._lean = self._transport if isinstance(self._transport, KeepAliveTransport) else None
        self._auth = f"Authorization: Bearer {api_key}\r\n".encode() if api_key else b""
        self._http = httpx.AsyncClient(
            transport=self._transport,
            timeout=httpx.Timeout(config.timeout, connect=config.connect_timeout),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
            headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
        )
        self._version = version
        self._last_update: tuple[str | None, int] | None = None  # (checkpoint path, or None: by broadcast; version)
        # name -> path of the adapters every server holds (load_lora_adapter); None: sent by broadcast
        self._adapters: dict[str, str | None] = {}
        self._lora: tuple[str, int] | None = None  # (name, version) of the adapter every request names
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self._released: set[str] = set()  # memory every server freed while paused ("weights", "kv_cache")
        # a server came back from a restart while the weights travel by broadcast: it is out of
        # rotation until the weight group is formed again and the next update reaches it
        self.needs_rejoin = False
        # requests: generate/generate_group calls; posts: /generate HTTP requests (batched)
        self.stats = {"requests": 0, "posts": 0, "resumes": 0, "reruns": 0, "retries": 0, "servers_lost": 0}
        # what the engine's backend reaches the servers through; sglang-router's typed /generate takes one
        # sampling_params object and one rid string (a list of either is a 422), so behind it nothing is batched
        self._link = Servers(
            members=self._servers, post=self._post, control=self._control, every_server=self._every_server,
            get=self._get_json, as_version=self._as_version, lora=lambda: self._lora, stats=self.stats,
            timeout=config.timeout, control_timeout=config.control_timeout,
            batch_max_new_tokens=-1 if router else config.batch_max_new_tokens)
        self._backends: dict[type, EngineBackend] = {}  # one per class: it may keep state (vLLM's reload method)
        # the engine's backend; None until the servers were asked (engine: auto)
        self._backend = None if config.engine == AUTO else self._backend_of(ENGINES[config.engine])
        self._asking: asyncio.Future[EngineBackend] | None = None

    @property
    def version(self) -> int:
        """The policy version the servers were last updated to (DESIGN.md §4 step 5)."""
        return self._version

    def policy(self) -> dict[str, Any]:
        """What another client of the same servers needs in order to generate as this one does
        after its weight updates (``follow``): the version, the last update's checkpoint (a
        restarted server is re-synced to it), the adapters the servers hold and the one every
        request names, and whether a server waits for the weight group to form again."""
        return {"version": self._version, "last_update": self._last_update, "lora": self._lora,
                "adapters": dict(self._adapters), "needs_rejoin": self.needs_rejoin}

    def follow(self, policy: dict[str, Any]) -> None:
        """Generate from now on as the client whose ``policy()`` this is: the publisher's, when
        this client is another process's (the rollout process, ``agentrl.run.rollout_process``)."""
        self._version, self._last_update = int(policy["version"]), policy["last_update"]
        self._lora, self._adapters = policy["lora"], dict(policy["adapters"])
        self.needs_rejoin = bool(policy["needs_rejoin"])

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self._servers]

    def healthy_addresses(self) -> list[str]:
        return [s.address for s in self._servers if s.healthy]

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> RemoteEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ generation

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *,
                       on_progress: Callable[[Completion], None] | None = None) -> Completion:
        """Generate until a real finish; ``on_progress``, if given, hears the tokens so far each
        time the request was interrupted (the episode log keeps them across a crash). Raises
        ``ResumeLimit`` after ``max_resumes`` interruptions of this one request."""
        self.stats["requests"] += 1
        await self._resolve()
        return await self._complete(_prompt(input_ids), sampling, Completion([], [], [], "abort"),
                                    on_progress=on_progress)

    async def generate_group(self, input_ids: Sequence[int], sampling: SamplingParams, n: int) -> list[Completion]:
        """``n`` samples of one prompt, sent as one request; see the module docstring."""
        prompt = _prompt(input_ids)
        if n < 1:
            raise RequestRejected(f"n must be >= 1, got {n}", 400)
        each = [sampling] * n if sampling.seed is None else [replace(sampling, seed=sampling.seed + i) for i in range(n)]
        alone = self._router is not None or not (await self._resolve()).batch_form
        if alone and n > 1 and sampling.seed is not None:
            return list(await asyncio.gather(*(self.generate(prompt, sp) for sp in each)))
        self.stats["requests"] += 1
        await self._wait_unpaused()
        server = await self._pick()
        server.inflight += n
        try:
            results = await self._submit(server, prompt, each)
        except (*TRANSPORT_ERRORS, ServerError) as e:
            log.warning("a group of %d on %s failed (%r); re-running its samples one by one", n, server.address, e)
            self.stats["retries"] += 1
            return list(await asyncio.gather(*(self.generate(prompt, sp) for sp in each)))
        finally:
            server.inflight -= n
        jobs = []
        for (tokens, logprobs, versions, reason), sp in zip(results, each, strict=True):
            jobs.append(self._complete(prompt, sp, Completion(tokens, logprobs, versions, "abort"), server, reason))
        return list(await asyncio.gather(*jobs))

    async def prompt_logprobs(self, input_ids: Sequence[int]) -> list[float | None]:
        """Score, not generate: the log-probability of each of ``input_ids`` given the ones before it
        (None for the first), in the engine's form (``EngineBackend.prompt_logprobs``). A
        transport error or a 5xx is retried (on the least loaded healthy server) up to ``max_retries``."""
        prompt = _prompt(input_ids)
        return await self._scoring(lambda backend, server: backend.prompt_logprobs(server, prompt))

    async def tokenize(self, text: str) -> list[int]:
        """The token ids the servers' tokenizer gives ``text`` (``EngineBackend.tokenize``)."""
        return await self._scoring(lambda backend, server: backend.tokenize(server, text))

    async def _scoring(self, call: Callable[[EngineBackend, _Server], Any]) -> Any:
        backend = await self._resolve()
        failures = 0
        while True:
            server = await self._pick()
            server.inflight += 1
            try:
                return await call(backend, server)
            except (*TRANSPORT_ERRORS, ServerError) as e:
                if failures >= self.max_retries:
                    raise ServerUnavailable(f"scoring failed on {server.address} after {failures + 1} tries ({e!r}); "
                                            "check that the server is up") from e
                if isinstance(e, TRANSPORT_ERRORS) and not await self._alive(server):
                    self._mark_down(server, e)
                self.stats["retries"] += 1
                await asyncio.sleep(self.backoff * 2 ** failures)
                failures += 1
            finally:
                server.inflight -= 1

    async def _submit(self, server: _Server, prompt: list[int], each: list[SamplingParams],
                      rid: str | None = None) -> list[Sample]:
        """One generation request of ``len(each)`` samples (one prompt; ``each`` all alike
        unless seeded), parsed by the engine's backend (the fallback's while no server answered
        the question: ``generate`` asked it already)."""
        backend = self._backend or self._backend_of(ENGINES[FALLBACK])
        return await backend.generate(server, prompt, each, rid)

    def _backend_of(self, cls: type[EngineBackend]) -> EngineBackend:
        if cls not in self._backends:
            self._backends[cls] = cls(self._link)
        return self._backends[cls]

    async def _resolve(self) -> EngineBackend:
        """The servers' engine's backend; with ``engine: auto`` asked once of the first server
        that answers. The calls that come meanwhile wait for that one question, and so go on
        in the same tick (a rollout's first requests still leave in one batch)."""
        if self._backend is not None:
            return self._backend
        if self._asking is None or self._asking.done():
            self._asking = asyncio.ensure_future(self._ask_engine())
        return await asyncio.shield(self._asking)

    async def _ask_engine(self) -> EngineBackend:
        for s in self._servers:
            try:
                r = await self._http.get(s.address + "/v1/models", timeout=min(10.0, self.control_timeout))
                owners = {m.get("owned_by") for m in r.json().get("data", [])} if r.status_code == 200 else set()
            except (httpx.HTTPError, ValueError, AttributeError):
                continue
            self._backend = self._backend_of(detect(owners))
            log.debug("inference servers: %s (GET %s/v1/models)", type(self._backend).__name__, s.address)
            return self._backend
        return self._backend_of(ENGINES[FALLBACK])  # none answers yet: asked again on the next call

    async def _complete(self, prompt: list[int], sampling: SamplingParams, done: Completion,
                        server: _Server | None = None, first: dict[str, Any] | None = None,
                        on_progress: Callable[[Completion], None] | None = None) -> Completion:
        """Generate until finished, from ``done``'s tokens so far; ``first`` is the finish
        reason they came with, if they came from a request already answered by ``server``.
        Each request goes through the batcher (with the others of its tick)."""
        tokens, logprobs, versions = done.tokens, done.logprobs, done.versions
        base_rid = unique_hex()
        resumes = failures = attempt = 0
        if server is not None:
            server.inflight += 1
        try:
            while True:
                if first is not None:
                    reason, first = first, None
                else:
                    remaining = sampling.max_new_tokens - len(tokens)
                    if attempt and remaining <= 0:
                        return Completion(tokens, logprobs, versions, "length")
                    await self._wait_unpaused()
                    if server is None or not server.healthy:
                        if server is not None:
                            server.inflight -= 1
                            server = None
                        server = await self._pick()
                        server.inflight += 1
                    this = sampling.continued(len(tokens))
                    rid = f"{base_rid}-{attempt}"
                    attempt += 1
                    try:
                        ((new_tokens, new_lps, new_versions, reason),) = await self._submit(
                            server, prompt + tokens, [this], rid)
                    except TRANSPORT_ERRORS as e:
                        # Dead, or a transient hiccup? A server that still answers /health keeps
                        # the request (re-sent there); one that does not is taken out.
                        failures += 1
                        if not await self._alive(server):
                            self._mark_down(server, e)
                            self.stats["reruns"] += 1
                        else:
                            log.warning("transport error from %s (%r); retrying there", server.address, e)
                            self.stats["retries"] += 1
                        if failures > self.max_retries + len(self._servers):
                            raise ServerUnavailable(f"generation failed on every server ({e!r}); "
                                                    "check that the inference servers are up") from e
                        await asyncio.sleep(self.backoff * min(2 ** (failures - 1), 16))
                        continue
                    except ServerError:
                        failures += 1
                        self.stats["retries"] += 1
                        if failures > self.max_retries:
                            raise
                        await asyncio.sleep(self.backoff * 2 ** (failures - 1))
                        continue
                    tokens += new_tokens
                    logprobs += new_lps
                    versions += new_versions
                    if new_tokens:
                        failures = 0
                attempt = max(attempt, 1)
                kind = reason.get("type")
                if kind == "abort":
                    code = reason.get("status_code")
                    if code is not None and code >= 400:
                        raise ServerError(f"{server and server.address} failed the request: {reason.get('message')}")
                    resumes += 1
                    self.stats["resumes"] += 1
                    if on_progress is not None:
                        on_progress(Completion(list(tokens), list(logprobs), list(versions), "abort"))
                    if resumes > self.max_resumes:
                        raise ResumeLimit(f"a request was interrupted {resumes} times (max_resumes="
                                          f"{self.max_resumes}); are weight updates coming faster than one "
                                          "generation?", Completion(tokens, logprobs, versions, "abort"))
                    continue
                if kind not in ("stop", "length"):
                    raise ServerError(f"{server and server.address} answered an unknown finish_reason {reason!r}")
                return Completion(tokens, logprobs, versions, kind, reason.get("matched"))
        finally:
            if server is not None:
                server.inflight -= 1

    def _as_version(self, v: Any) -> int:
        try:
            return int(v)
        except (TypeError, ValueError):
            return self._version

    async def _wait_unpaused(self) -> None:
        if self._unpaused.is_set():
            return
        try:
            async with asyncio.timeout(self.timeout):
                await self._unpaused.wait()
        except TimeoutError as e:
            raise ServerUnavailable(f"generation stayed paused for over {self.timeout:.0f} s; "
                                    "was resume() called after the weight update?") from e

    # ------------------------------------------------------------------ servers

    async def _pick(self) -> _Server:
        if self._router is not None:  # the router picks the worker; a failed call is retried through it
            self._router.healthy = True
            return self._router
        for round_ in range(self.max_retries + 1):
            now = time.monotonic()
            for s in self._servers:
                if not s.healthy and now - s.down_since >= self.health_check_interval:
                    await self._probe(s)
            healthy = [s for s in self._servers if s.healthy]
            if healthy:
                return min(healthy, key=lambda s: s.inflight)
            await asyncio.sleep(max(self.health_check_interval, self.backoff * 2 ** round_))
        raise ServerUnavailable(
            f"no healthy inference server among {self.addresses}; start one with `agentrl serve --model DIR`")

    def _mark_down(self, server: _Server, error: BaseException) -> None:
        if server.healthy:
            log.warning("inference server %s failed (%r); taking it out", server.address, error)
            self.stats["servers_lost"] += 1
        server.healthy = False
        server.down_since = time.monotonic()

    async def _alive(self, server: _Server) -> bool:
        try:
            r = await self._http.get(server.address + "/health", timeout=min(10.0, self.control_timeout))
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    async def _probe(self, server: _Server) -> bool:
        """``GET /health``; a server that answers is re-synced to the current weights."""
        was_stale, server.stale = server.stale, False
        try:
            r = await self._http.get(server.address + "/health", timeout=min(5.0, self.control_timeout))
            ok = r.status_code == 200
            if ok and self._last_update is not None:
                backend = await self._resolve()
                info = (await self._http.get(server.address + backend.version_route, timeout=10.0)).json()
                path, version = self._last_update
                if str(info.get("weight_version")) != str(version):
                    if path is None:  # the weights came by broadcast: it waits out of rotation for the next one
                        ok = False
                        if not was_stale:
                            log.warning("inference server %s came back without the weights of version %d (sent by "
                                        "broadcast); it generates again after the next update", server.address,
                                        version)
                        server.stale = self.needs_rejoin = True
                    else:
                        await backend.reload_server(server, path, version)
            if ok and self._adapters:  # a restarted server holds no adapter: load them again
                cards = (await self._http.get(server.address + "/v1/models", timeout=10.0)).json()
                held = {c.get("id") for c in cards.get("data", [])} if isinstance(cards, dict) else set()
                load, _ = (await self._resolve()).lora_routes
                for name, path in self._adapters.items():
                    if name in held:
                        continue
                    if path is None:  # came by broadcast: it waits out of rotation for the next one
                        ok = False
                        if not was_stale:
                            log.warning("inference server %s came back without the LoRA adapter %s (sent by "
                                        "broadcast); it generates again after the next update", server.address, name)
                        server.stale = self.needs_rejoin = True
                        break
                    await self._post(server, load, {"lora_name": name, "lora_path": path}, self.control_timeout,
                                     plain=True)
            if ok and not self._unpaused.is_set():  # back inside a pause: paused as the others are
                route, body = (await self._resolve()).pause()
                await self._post(server, route, body, self.control_timeout)
        except (httpx.HTTPError, ValueError, ServerError, RequestRejected):
            ok = False
        server.down_since = time.monotonic()
        server.healthy = ok
        if ok:
            log.info("inference server %s is back", server.address)
        return ok

    async def check_health(self) -> dict[str, bool]:
        """Probe every server now; returns address -> healthy."""
        await asyncio.gather(*(self._probe(s) for s in self._servers))
        return {s.address: s.healthy for s in self._servers}

    async def _get_json(self, server: _Server, path: str, seconds: float) -> Any:
        """The decoded JSON of a 200 answer to ``GET path``, else None."""
        r = await self._http.get(server.address + path, timeout=seconds)
        return r.json() if r.status_code == 200 else None

    async def _post(self, server: _Server, path: str, payload: dict[str, Any], seconds: float, *,
                    plain: bool = False) -> Any:
        """The decoded JSON answer; ``plain``: a success may be plain text (vLLM's LoRA routes)."""
        if self._lean is not None and server.origin is not None:
            status, content = await self._lean.post_json(server.origin, path, json.dumps(payload).encode(),
                                                         read_timeout=seconds, headers=self._auth,
                                                         connect_timeout=self.config.connect_timeout)
        else:
            r = await self._http.post(server.address + path, json=payload,
                                      timeout=httpx.Timeout(seconds, connect=self.config.connect_timeout))
            status, content = r.status_code, r.content
        if status >= 500:
            raise ServerError(f"{server.address}{path} answered HTTP {status}: {_text(content)}")
        try:
            data = json.loads(content) if content else None
        except ValueError as e:
            if plain and status < 400:
                return _text(content)
            raise ServerError(f"{server.address}{path} answered non-JSON: {_text(content)}") from e
        if status >= 400:
            err = data.get("error", data.get("message", data.get("detail", data))) if isinstance(data, dict) else data
            if isinstance(err, dict):
                err = err.get("message", err)
            raise RequestRejected(f"{server.address}{path} refused the request: {err}", status)
        return data

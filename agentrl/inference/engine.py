"""The continuous-batching engine behind ``agentrl serve``.

What it is: one thread that owns a ``Decoder`` (weights + slot KV cache) and a
``PrefixCache``, and loops: apply queued commands (new requests, aborts, pause/continue,
weight swaps, cache flushes), admit waiting requests into free slots, then run *one* forward
pass for everything that has work — each running request's next token and the prompts of
the newly admitted ones, packed together (``decoder.Step``) — and sample one token per row.
Requests join and leave the batch at every step, so no request waits for another to finish.
Everything that touches the model runs on that thread; other threads talk to it only
through ``submit``/``abort``/``pause``/``resume``/``install_weights``/``flush_cache``
(thread-safe), and hear back through each request's ``notify`` callback, which runs on the
engine thread and must only hand the news over (e.g. ``loop.call_soon_threadsafe``).

Prompt sharing: on admission a request's prompt (plus its output so far, for a retracted
request) is matched against the prefix cache; the cached prefix's keys/values are copied into
its slot and only the rest is computed — at least the last token, whose logits are needed.
Every computed prompt, and every finished request's prompt + output, is inserted back, so the
``n`` samples of a group and the next turn of an episode start from the cache. A request
whose prompt would be (mostly) cached by another request admitted in the same step waits one
step for it (``_waits_for_batch``): ``n`` samples of one prompt prefill it once. Reuse
reports as ``cached_tokens`` per request and as counters on the engine.

Pause modes (SGLang's): ``abort`` finishes every running and queued request with
``finish_reason`` abort and its partial output; ``retract`` frees the slots of running
requests and puts them back at the head of the queue, to be re-prefilled (prompt + output so
far) after ``resume`` — under the new weights if they changed; ``in_place`` just stops
stepping. While paused nothing new is admitted (new requests wait in the queue).

A weight swap happens between two steps: every token sampled afterwards comes from the new
weights and carries the new version (requests still running keep their KV cache from the
old weights, as SGLang's in-place update does). The swap empties the prefix cache and starts
a new cache *epoch*: keys/values computed before it are never inserted again, so no prefix
computed with old weights serves a request after the update.

What it is not: speculative decoding, chunked prefill (a prompt is computed in one step) or
multi-GPU.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from agentrl.api import SamplingParams
from agentrl.inference.decoder import Decoder, Step
from agentrl.inference.prefix_cache import PrefixCache
from agentrl.inference.sampling import sample_rows

log = logging.getLogger(__name__)

PREFILL_TOKEN_BUDGET = 4096
"""Most uncached prompt tokens computed in one step (a longer prompt still goes alone): bounds
how long a pause or a running batch waits behind a burst of long prompts."""

SHARED_PREFIX_WAIT = 32
"""A request waits one step for a request admitted before it in the same step when that one
will cache at least this many more of its tokens (or all of them but the last)."""


@dataclass(eq=False)
class Request:
    """One generation request and its state. Only the engine thread mutates it after submit."""

    rid: str
    input_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    top_logprobs_num: int = 0
    stream: bool = False
    notify: Callable[[Request, bool], None] | None = None  # (request, finished), engine thread
    # state, written by the engine thread
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    finish_reason: dict[str, Any] | None = None
    num_retractions: int = 0
    created: float = field(default_factory=time.time)
    started: bool = False  # has been prefilled at least once (reached a slot)
    slot: int | None = None
    rng: random.Random | None = None
    cached_tokens: int = 0  # prompt tokens taken from the prefix cache, summed over admissions
    kv_epoch: int = -1  # cache epoch its slot's keys/values were computed in (-1: none usable)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class _Admitted(NamedTuple):
    """A request placed in a slot this step: ``seq`` (prompt + output so far) is to be in
    the slot, positions ``start ..`` computed — or, for a twin, copied from ``leader``."""

    req: Request
    seq: list[int]
    start: int
    leader: Request | None


class Engine:
    """Continuous batching over ``num_slots`` KV-cache slots; see the module docstring."""

    def __init__(self, decoder: Decoder, *, eos_token_ids: set[int], decode_text: Callable[[list[int]], str],
                 weight_version: str = "default", seed: int = 0, prefix_cache: PrefixCache | None = None) -> None:
        self.decoder = decoder
        self.cache = prefix_cache  # None: --disable-radix-cache
        self._epoch = 0  # bumped by every weight swap
        self._saves: dict[int, tuple[int, int]] = {}  # pool entry -> (slot, position), queued
        self.eos_token_ids = set(eos_token_ids)
        self.decode_text = decode_text
        self.weight_version = weight_version
        self.context_length = decoder.max_len
        self._rng = random.Random(seed)
        self._commands: queue.Queue[Callable[[], None]] = queue.Queue()
        self._waiting: deque[Request] = deque()
        self._slots: list[Request | None] = [None] * decoder.num_slots
        self._live: dict[str, Request] = {}
        self.paused: str | None = None  # None, or the pause mode
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="agentrl-engine", daemon=True)
        self.steps = 0  # forward passes that decoded running requests
        self.generated_tokens = 0
        self.prefill_calls = 0  # forward passes that computed admitted prompts (most also decode)
        self.prompt_tokens = 0  # prompt (+ output so far) tokens of admitted requests
        self.cached_prompt_tokens = 0  # ... of which the prefix cache held
        self.prefill_s = 0.0  # wall time in forward passes that computed prompts
        self.decode_s = 0.0  # wall time in forward passes that only decoded

    # ------------------------------------------------------------------ thread-safe API

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._commands.put(lambda: None)
        self._thread.join(timeout=10)

    def submit(self, *reqs: Request) -> None:
        """Queue requests. Each one's ``notify`` is called when it finishes (and per step if streaming)."""
        def run() -> None:
            for req in reqs:
                self._admit_to_queue(req)
        self._commands.put(run)

    def abort(self, rid: str = "", abort_all: bool = False, message: str = "Aborted") -> None:
        """Finish the matching live requests (rid prefix, SGLang's rule) as aborted."""
        def run() -> None:
            for r in list(self._live.values()):
                if abort_all or (rid and r.rid.startswith(rid)):
                    self._abort(r, message)
        self._commands.put(run)

    def pause(self, mode: str = "abort") -> Future:
        """Pause generation; the future resolves when the mode's work is done."""
        return self._call(lambda: self._pause(mode))

    def resume(self) -> Future:
        def run() -> None:
            self.paused = None
        return self._call(run)

    def install_weights(self, weights: dict, version: str | None, abort_all: bool = False) -> Future:
        """Swap in weights prepared by ``Decoder.prepare_weights`` between two steps; the
        prefix cache is emptied and a new cache epoch begins."""
        def run() -> None:
            if abort_all:
                for r in list(self._live.values()):
                    self._abort(r, "Aborted by a weight update")
            if weights is not self.decoder.weights:
                self.decoder.weights = weights
                self._epoch += 1
                self._flush_cache()
            if version is not None:
                self.weight_version = version
        return self._call(run)

    def flush_cache(self) -> Future:
        """Empty the prefix cache if no request is running or waiting (SGLang's rule);
        resolves to whether it did."""
        def run() -> bool:
            if self._live:
                return False
            self._flush_cache()
            return True
        return self._call(run)

    @property
    def alive(self) -> bool:
        """The engine thread is running (a dead engine makes ``/health`` answer 503)."""
        return self._thread.is_alive()

    def load(self) -> dict[str, int]:
        running = sum(1 for r in self._slots if r is not None)
        return {"num_running_reqs": running, "num_waiting_reqs": len(self._live) - running}

    def cache_stats(self) -> dict[str, Any]:
        """Prefix-cache counters (racy reads of ints: fine for reporting)."""
        c = self.cache
        return {"cache_hit_rate": round(self.cached_prompt_tokens / self.prompt_tokens, 4) if self.prompt_tokens else 0.0,
                "num_prompt_tokens": self.prompt_tokens, "num_cached_tokens": self.cached_prompt_tokens,
                "radix_cache_tokens": c.size if c else 0, "radix_cache_capacity": c.capacity if c else 0,
                "radix_cache_evicted_tokens": c.evicted if c else 0}

    def is_live(self, rid: str) -> bool:
        return rid in self._live

    # ------------------------------------------------------------------ engine thread

    def _call(self, fn: Callable[[], Any]) -> Future:
        fut: Future = Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as e:  # handed to the caller
                fut.set_exception(e)
        self._commands.put(run)
        return fut

    def _admit_to_queue(self, req: Request) -> None:
        if req.rid in self._live:
            req.finish_reason = {"type": "abort", "message": f"Duplicate request ID detected: {req.rid}",
                                 "status_code": 400, "err_type": "BadRequestError"}
            self._notify(req, True)
            return
        seed = req.sampling.seed
        # a seeded request draws from its own RNG (the same tokens whatever shares its batch);
        # the others share the engine's (seeding one Random per request costs ~25 us)
        req.rng = random.Random(seed) if seed is not None else self._rng
        self._live[req.rid] = req
        if req.sampling.max_new_tokens <= 0:
            self._finish(req, {"type": "length", "length": req.sampling.max_new_tokens})
            return
        self._waiting.append(req)

    def _pause(self, mode: str) -> None:
        self.paused = mode
        if mode == "abort":
            for r in list(self._live.values()):
                self._abort(r, "Aborted")
        elif mode == "retract":
            running = [r for r in self._slots if r is not None]
            for r in reversed(running):
                self._release(r)
                r.num_retractions += 1
                self._waiting.appendleft(r)

    def _abort(self, req: Request, message: str) -> None:
        if req.finished:
            return
        if req.started:
            reason = {"type": "abort", "message": message, "status_code": None, "err_type": None}
        else:
            reason = {"type": "abort", "message": "Abort in waiting queue"}
        self._finish(req, reason)

    def _finish(self, req: Request, reason: dict[str, Any]) -> None:
        req.finish_reason = reason
        if req.slot is not None:
            self._release(req)
        if req in self._waiting:
            self._waiting.remove(req)
        self._live.pop(req.rid, None)
        self._notify(req, True)

    def _release(self, req: Request) -> None:
        """Free ``req``'s slot, first caching what it holds: every token but the last
        sampled one (not fed yet), if computed under the current weights."""
        assert req.slot is not None
        self._cache_slot(req, req.input_ids + req.output_ids[:-1] if req.output_ids else req.input_ids)
        self._slots[req.slot] = None
        req.slot = None
        req.kv_epoch = -1

    def _cache_slot(self, req: Request, seq: list[int]) -> None:
        """Insert ``seq`` (held at positions ``0 ..`` of ``req``'s slot) into the prefix cache,
        unless its keys/values predate the current weights. The copies into the pool are
        queued and made in one go before the next admission (before any slot is reused)."""
        if self.cache is None or req.kv_epoch != self._epoch:
            return
        slot = req.slot

        def store(start: int, entries: list[int]) -> None:
            for j, e in enumerate(entries):  # a later save to an evicted-and-reused entry wins
                self._saves[e] = (slot, start + j)
        self.cache.insert(seq, store)

    def _flush_saves(self) -> None:
        if self._saves:
            self.decoder.save_prefixes(self._saves)
            self._saves = {}

    def _flush_cache(self) -> None:
        self._saves = {}  # their entries are freed with the tree
        if self.cache is not None:
            self.cache.flush()

    def _notify(self, req: Request, finished: bool) -> None:
        if req.notify is not None:
            try:
                req.notify(req, finished)
            except Exception:  # a listener's bug must not stop the engine
                log.exception("notify failed for request %s", req.rid)

    def _drain_commands(self, block: bool) -> None:
        try:
            cmd = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            try:
                cmd()
            except Exception:  # a failing command must not kill the engine thread
                log.exception("engine command failed")
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return

    def _loop(self) -> None:
        while not self._stop.is_set():
            running = any(r is not None for r in self._slots)
            idle = self.paused is not None or (not running and not self._waiting)
            self._drain_commands(block=idle)
            if self.paused is not None:
                continue
            try:
                self._step()
            except Exception as e:  # keep serving: fail the requests in the batch, not the server
                log.exception("engine step failed")
                for r in [r for r in self._slots if r is not None]:
                    r.kv_epoch = -1  # its keys/values may be half written: never cache them
                    self._finish(r, {"type": "abort", "message": f"engine error: {e}", "status_code": 500,
                                     "err_type": "InternalServerError"})

    def _step(self) -> None:
        """Admit, then one forward pass: decode rows for running requests (and admitted ones
        with a single uncached token), prefill rows for the other admitted ones; twins take
        their leader's keys/values and logits."""
        admitted = self._admit()
        fresh = {id(a.req): a for a in admitted}
        hi = 0  # decode rows cover slots 0 .. hi - 1
        decode_of: dict[int, tuple[int, int]] = {}
        for i, r in enumerate(self._slots):
            a = fresh.get(id(r))
            if r is None or (a is not None and (a.leader is not None or len(a.seq) - a.start > 1)):
                continue
            seq = a.seq if a is not None else r.output_ids
            decode_of[i] = (seq[-1], len(r.input_ids) + len(r.output_ids) - 1)
            hi = i + 1
        if not decode_of and not admitted:
            return
        prefill = [a for a in admitted if a.leader is None and len(a.seq) - a.start > 1]
        step = Step([decode_of.get(i) for i in range(hi)], [(a.req.slot, a.start, a.seq[a.start:]) for a in prefill])
        t0 = time.perf_counter()
        logits = self.decoder.forward(step)
        if admitted:
            self.prefill_calls += 1
            self.prefill_s += time.perf_counter() - t0
        else:
            self.decode_s += time.perf_counter() - t0
        if any(id(self._slots[i]) not in fresh for i in decode_of):
            self.steps += 1
        row_of = {id(self._slots[i]): i for i in decode_of}
        row_of.update({id(a.req): hi + j for j, a in enumerate(prefill)})
        twins = [a for a in admitted if a.leader is not None]
        self.decoder.copy_prefixes([(a.leader.slot, a.req.slot, len(a.seq)) for a in twins])
        for a in admitted:  # the slot now holds the whole prompt: share it
            a.req.kv_epoch = self._epoch
            if a.leader is None:
                self._cache_slot(a.req, a.seq)
        batch = [self._slots[i] for i in decode_of] + [a.req for a in prefill] + [a.req for a in twins]
        rows = [row_of[id(r)] for r in batch[: len(batch) - len(twins)]] + [row_of[id(a.leader)] for a in twins]
        if rows != list(range(logits.shape[0])):
            logits = logits[torch.tensor(rows, device=logits.device)]
        self._sample_and_append(batch, logits)

    def _admit(self) -> list[_Admitted]:
        """Move waiting requests into free slots (lowest first), within the prefill token
        budget, and copy each one's cached prefix into its slot. A request whose tokens equal
        those of one admitted before it in this step is its *twin*: it computes nothing."""
        self._flush_saves()
        free = [i for i, r in enumerate(self._slots) if r is None]
        admitted: list[_Admitted] = []
        leaders: dict[tuple[int, ...], Request] = {}
        deferred: list[Request] = []
        loads: list[tuple[int, list[int]]] = []
        budget = PREFILL_TOKEN_BUDGET
        while self._waiting and len(admitted) < len(free) and len(deferred) <= len(self._slots):
            req = self._waiting[0]
            seq = req.input_ids + req.output_ids
            leader = leaders.get(tuple(seq)) if self.cache is not None else None
            entries: list[int] = []
            if leader is None and self.cache is not None:
                entries = self.cache.match(seq[:-1])
                if self._waits_for_batch(seq, len(entries), admitted):
                    deferred.append(self._waiting.popleft())
                    continue
            uncached = 0 if leader is not None else len(seq) - len(entries)
            if admitted and uncached > budget:
                break
            budget -= uncached
            self._waiting.popleft()
            req.slot = free[len(admitted)]
            self._slots[req.slot] = req
            req.started = True
            reused = len(seq) if leader is not None else len(entries)
            req.cached_tokens += reused
            self.prompt_tokens += len(seq)
            self.cached_prompt_tokens += reused
            if entries:
                loads.append((req.slot, entries))
            if leader is None and self.cache is not None:
                leaders[tuple(seq)] = req
            admitted.append(_Admitted(req, seq, len(entries), leader))
        self._waiting.extendleft(reversed(deferred))
        self.decoder.load_prefixes(loads)
        return admitted

    @staticmethod
    def _waits_for_batch(seq: list[int], cached: int, admitted: list[_Admitted]) -> bool:
        """Whether a request admitted earlier in this step will cache enough of ``seq``
        (all but its last token, or ``SHARED_PREFIX_WAIT`` more tokens) to wait a step for it."""
        want = len(seq) - 1
        if want <= cached:
            return False
        ahead = min(want, cached + SHARED_PREFIX_WAIT)
        head = seq[:ahead]
        return any(a.seq[:ahead] == head for a in admitted)

    def _sample_and_append(self, batch: list[Request], logits: torch.Tensor) -> None:
        dev = logits.device
        settings = [(r.sampling.temperature, r.sampling.top_k, r.sampling.top_p) for r in batch]
        if settings.count(settings[0]) == len(settings):  # the usual case: one setting for the batch
            settings = settings[:1]
        t, k, p = zip(*settings, strict=True)
        temperature = torch.tensor(t, dtype=torch.float32, device=dev).expand(len(batch))
        top_k = torch.tensor(k, dtype=torch.long, device=dev).expand(len(batch))
        top_p = torch.tensor(p, dtype=torch.float32, device=dev).expand(len(batch))
        uniform = torch.tensor([r.rng.random() for r in batch], dtype=torch.float32, device=dev)
        top_n = max(r.top_logprobs_num for r in batch)
        tokens, logprobs, top = sample_rows(logits, temperature, top_k, top_p, uniform, top_n)
        tokens, logprobs = tokens.tolist(), logprobs.tolist()
        top_vals, top_ids = (top[0].tolist(), top[1].tolist()) if top is not None else (None, None)
        for i, r in enumerate(batch):
            tok = tokens[i]
            r.output_ids.append(tok)
            r.logprobs.append(logprobs[i])
            r.versions.append(self.weight_version)
            if r.top_logprobs_num:
                n = r.top_logprobs_num
                pairs = zip(top_vals[i][:n], top_ids[i][:n], strict=True)
                r.top_logprobs.append([(v, t) for v, t in pairs if v != float("-inf")])  # kept tokens only
            self.generated_tokens += 1
            reason = self._stop_reason(r, tok)
            if reason is not None:
                self._finish(r, reason)
            elif r.stream:
                self._notify(r, False)

    def _stop_reason(self, r: Request, tok: int) -> dict[str, Any] | None:
        sp = r.sampling
        if not sp.ignore_eos and (tok in self.eos_token_ids or tok in sp.stop_token_ids):
            return {"type": "stop", "matched": tok}
        if sp.stop:
            text = self.decode_text(r.output_ids)
            hits = [(text.find(s), s) for s in sp.stop if s and s in text]
            if hits:
                return {"type": "stop", "matched": min(hits)[1]}
        if len(r.output_ids) >= sp.max_new_tokens:
            return {"type": "length", "length": sp.max_new_tokens}
        if len(r.input_ids) + len(r.output_ids) >= self.context_length:
            return {"type": "length", "length": len(r.output_ids)}
        return None

"""The continuous-batching scheduler behind ``agentrl serve``: one thread owns the model.

What it is: ``Scheduler``, a thread that owns a ``Decoder`` (weights + slot KV cache) and a
``PrefixCache`` and loops: apply queued commands (new requests, aborts, pause/continue, weight
swaps, cache flushes), admit waiting requests into free slots (their cached prefix copied in),
then run *one* packed forward pass for every row with work (``decoder.Step``) and sample one
token per row. Other threads talk to it only through ``submit``/``abort``/``pause``/``resume``/
``install_weights``/``flush_cache`` (thread-safe) and hear back through each request's
``notify``, which runs on the scheduler thread and must only hand the news over
(``loop.call_soon_threadsafe``). Prompt sharing and cache invalidation: docs/DESIGN.md §4.

Contracts: pause modes are SGLang's (``abort`` finishes requests with their partial output,
``retract`` re-queues them for a re-prefill after ``resume``, ``in_place`` stops stepping);
a weight swap happens between two steps, so every later token comes from the new weights and
carries the new version, and it starts a new cache epoch (no prefix computed with old weights
is served again); a step that raises is re-run one unit at a time and only the units that
fail again finish, each with its own error (``abort``, status 500); prompt logprobs
(``logprob_start >= 0``) are the raw model distribution's, computed from an uncached prefill.
A request with a LoRA adapter (``GenRequest.lora``) shares keys/values only with twins of the
same adapter: it neither reads nor fills the prefix cache, whose entries are the base weights'.

What it is not: speculative decoding, chunked prefill (a prompt is computed in one step) or
multi-GPU.
"""

from __future__ import annotations

import logging
import queue
import random
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from agentrl.api import SamplingParams
from agentrl.errors import Refused
from agentrl.inference.decoder import Decoder, Step, decode_segments
from agentrl.inference.lora_adapter import LoraWeights
from agentrl.inference.prefix_cache import PrefixCache
from agentrl.inference.sampling import penalize, sample_rows

log = logging.getLogger(__name__)

PREFILL_TOKEN_BUDGET = 4096
"""Most uncached prompt tokens computed in one step (a longer prompt still goes alone): bounds
how long a pause or a running batch waits behind a burst of long prompts."""

PROMPT_LOGPROB_CHUNK = 256
"""Prompt positions turned into logits at once (bounds the [chunk, vocab] float32 buffer)."""

SORT_CHECK_EVERY = 4
"""Every this many steps the scheduler weighs reordering the running requests' slots longest
first (``Scheduler._sort_slots``)."""

SHARED_PREFIX_WAIT = 32
"""A request waits one step for a request admitted before it in the same step when that one
will cache at least this many more of its tokens (or all of them but the last)."""


@dataclass(eq=False)
class GenRequest:
    """One generation request and its state. Only the scheduler thread mutates it after submit."""

    rid: str
    input_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    top_logprobs_num: int = 0
    logprob_start: int = -1  # >= 0: logprobs of the prompt tokens from this position (input_token_logprobs)
    stream: bool = False
    stream_interval: int = 1  # a streaming request is told every this many tokens
    notify: Callable[[GenRequest, bool], None] | None = None  # (request, finished), scheduler thread
    lora: LoraWeights | None = None  # the LoRA adapter it is generated with (None: the served weights alone)
    # state, written by the scheduler thread
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_logprobs: list[float | None] = field(default_factory=list)  # input_ids[logprob_start:], first None
    input_top_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
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

    @property
    def scores_prompt(self) -> bool:
        """Its prompt logprobs are still to be computed (from the model's logits)."""
        return 0 <= self.logprob_start <= len(self.input_ids) - 2 and not self.input_logprobs


class _Admitted(NamedTuple):
    """A request placed in a slot this step: ``seq`` (prompt + output so far) is to be in
    the slot, positions ``start ..`` computed — or, for a twin, copied from ``leader``."""

    req: GenRequest
    seq: list[int]
    start: int
    leader: GenRequest | None


class Scheduler:
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
        self._waiting: deque[GenRequest] = deque()
        self._slots: list[GenRequest | None] = [None] * decoder.num_slots
        self._live: dict[str, GenRequest] = {}
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
        self._unsorted_keys = 0.0  # keys read since the last sort beyond what sorted slots would read
        self._steps_checked = 0

    # ------------------------------------------------------------------ thread-safe API

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._commands.put(lambda: None)
        self._thread.join(timeout=10)

    def submit(self, *reqs: GenRequest) -> None:
        """Queue requests. Each one's ``notify`` is called when it finishes (and per step if streaming)."""
        def run() -> None:
            for req in reqs:
                self._admit_to_queue(req)
        self._commands.put(run)

    def abort(self, rid: str = "", abort_all: bool = False, message: str = "Aborted") -> None:
        """Finish the live request with id ``rid`` (or all of them) as aborted. The id must
        match exactly, as at SGLang's HTTP API (its tokenizer manager drops unknown ids)."""
        def run() -> None:
            if abort_all:
                for r in list(self._live.values()):
                    self._abort(r, message)
            elif (r := self._live.get(rid)) is not None:
                self._abort(r, message)
        self._commands.put(run)

    def abort_requests(self, reqs: list[GenRequest], message: str = "Aborted") -> None:
        """Finish these requests as aborted (those still live), in one command."""
        def run() -> None:
            for r in reqs:
                if self._live.get(r.rid) is r:
                    self._abort(r, message)
        self._commands.put(run)

    def pause(self, mode: str = "abort") -> Future:
        """Pause generation; the future resolves when the mode's work is done."""
        return self._call(lambda: self._pause(mode))

    def resume(self) -> Future:
        def run() -> None:
            self.paused = None
        return self._call(run)

    def release_memory(self, tags: set[str]) -> Future:
        """Free the memory of ``tags`` (``agentrl.api.MEMORY_TAGS``) for another process's use — colocated
        training — until ``resume_memory``; with ``kv_cache`` released nothing runs (waiting
        requests wait). SGLang's rule: no request may be in a slot (pause generation first)."""
        def run() -> None:
            running = sum(1 for r in self._slots if r is not None)
            if running:
                raise Refused(f"cannot release memory while {running} request(s) are running; pause generation "
                              "first (POST /pause_generation with mode abort or retract)")
            if "weights" in tags:
                self.decoder.release_spares()
            if "kv_cache" in tags:
                self._flush_cache()
                self.decoder.release_kv()
        return self._call(run)

    def resume_memory(self, tags: set[str]) -> Future:
        """Occupy again what ``release_memory`` freed (the spares come back with the next staging)."""
        def run() -> None:
            if "kv_cache" in tags:
                self.decoder.occupy_kv()
        return self._call(run)

    def install_weights(self, weights: dict, version: str | None, abort_all: bool = False) -> Future:
        """Swap in weights prepared by ``Decoder.prepare_weights`` between two steps; the
        prefix cache is emptied and a new cache epoch begins."""
        def run() -> None:
            if abort_all:
                for r in list(self._live.values()):
                    self._abort(r, "Aborted by a weight update")
            if weights is not self.decoder.weights:
                self.decoder.swap_weights(weights)
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
        """The scheduler thread is running (a dead engine makes ``/health`` answer 503)."""
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

    def tokens_in_use(self) -> int:
        """Prompt + output tokens of the requests in slots (what SGLang's ``/get_load`` calls num_tokens)."""
        return sum(len(r.input_ids) + len(r.output_ids) for r in self._slots if r is not None)

    def is_live(self, rid: str) -> bool:
        return rid in self._live

    @property
    def num_live(self) -> int:
        """Requests submitted and not finished (racy read: fine for admission limits)."""
        return len(self._live)

    # ------------------------------------------------------------------ scheduler thread

    def _call(self, fn: Callable[[], Any]) -> Future:
        fut: Future = Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as e:  # handed to the caller
                fut.set_exception(e)
        self._commands.put(run)
        return fut

    def _admit_to_queue(self, req: GenRequest) -> None:
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
        if 0 <= req.logprob_start == len(req.input_ids) - 1:
            req.input_logprobs = [None]  # one prompt token asked for, and it has no logprob
            req.input_top_logprobs = [None] if req.top_logprobs_num else []
        if req.sampling.max_new_tokens <= 0 and not req.scores_prompt:
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

    def _abort(self, req: GenRequest, message: str) -> None:
        if req.finished:
            return
        if req.started:
            reason = {"type": "abort", "message": message, "status_code": None, "err_type": None}
        else:
            reason = {"type": "abort", "message": "Abort in waiting queue"}
        self._finish(req, reason)

    def _finish(self, req: GenRequest, reason: dict[str, Any]) -> None:
        req.finish_reason = reason
        if req.slot is not None:
            self._release(req)
        # a waiting request stays in the queue, finished, until _admit drops it (no O(n) remove)
        if self._live.get(req.rid) is req:
            del self._live[req.rid]
        self._notify(req, True)

    def _fail(self, reqs: list[GenRequest], error: BaseException) -> None:
        """Finish ``reqs`` with ``error``: an engine bug met while computing them."""
        for r in reqs:
            r.kv_epoch = -1  # its keys/values may be half written: never cache them
            if not r.finished:
                self._finish(r, {"type": "abort", "message": f"engine error: {error!r}", "status_code": 500,
                                 "err_type": "InternalServerError"})

    def _release(self, req: GenRequest) -> None:
        """Free ``req``'s slot, first caching what it holds: every token but the last
        sampled one (not fed yet), if computed under the current weights."""
        assert req.slot is not None
        self._cache_slot(req, req.input_ids + req.output_ids[:-1] if req.output_ids else req.input_ids)
        self._slots[req.slot] = None
        req.slot = None
        req.kv_epoch = -1

    def _cache_slot(self, req: GenRequest, seq: list[int]) -> None:
        """Insert ``seq`` (held at positions ``0 ..`` of ``req``'s slot) into the prefix cache,
        unless its keys/values predate the current weights. The copies into the pool are
        queued and made in one go before the next admission (before any slot is reused)."""
        if self.cache is None or req.kv_epoch != self._epoch or req.lora is not None:
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

    def _notify(self, req: GenRequest, finished: bool) -> None:
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
            except Exception:  # a failing command must not kill the scheduler thread
                log.exception("engine command failed")
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return

    def _held(self) -> bool:
        return self.paused is not None or self.decoder.kv_released

    def _loop(self) -> None:
        while not self._stop.is_set():
            running = any(r is not None for r in self._slots)
            idle = self._held() or (not running and not self._waiting)
            self._drain_commands(block=idle)
            if self._held():  # asked again: a pause (or a release) among the commands just run holds
                continue  # the requests submitted after it, in the same drain, in the queue
            try:
                self._step()
            except Exception as e:  # a bug outside the isolated part: fail what is in the slots
                log.exception("engine step failed")
                self._fail([r for r in self._slots if r is not None], e)

    def _step(self) -> None:
        """Admit, then one forward pass for everything that has work (``_compute``). If it
        raises, each unit is computed again alone — a running request, or an admitted one
        with its twins — and only the units that fail again are finished, with their error."""
        admitted = self._admit()
        fresh = {id(a.req) for a in admitted}
        running = [r for r in self._slots if r is not None and id(r) not in fresh]
        if not running and not admitted:
            return
        try:
            self._compute(running, admitted)
        except Exception:
            log.exception("engine step failed; computing its requests one unit at a time")
            units: list[tuple[list[GenRequest], list[_Admitted]]] = [([r], []) for r in running]
            by_leader: dict[int, list[_Admitted]] = {}
            for a in admitted:
                by_leader.setdefault(id(a.leader or a.req), []).append(a)
            units += [([], group) for group in by_leader.values()]
            for run, adm in units:
                run, adm = [r for r in run if not r.finished], [a for a in adm if not a.req.finished]
                if not run and not adm:
                    continue
                try:
                    self._compute(run, adm)
                except Exception as e:
                    log.exception("a unit of %d request(s) failed on its own", len(run) + len(adm))
                    self._fail([*run, *(a.req for a in adm)], e)

    def _compute(self, running: list[GenRequest], admitted: list[_Admitted]) -> None:
        """One forward pass: decode rows for ``running`` requests (and admitted ones with a
        single uncached token), prefill rows for the other admitted ones; twins take their
        leader's keys/values and logits. Then prompt logprobs, sampling and stop checks."""
        decode_of: dict[int, tuple[int, int]] = {}  # slot -> (token, position)
        for r in running:
            assert r.slot is not None
            decode_of[r.slot] = (r.output_ids[-1], len(r.input_ids) + len(r.output_ids) - 1)
        for a in admitted:
            if a.leader is None and len(a.seq) - a.start == 1:
                decode_of[a.req.slot] = (a.seq[-1], len(a.seq) - 1)
        hi = max(decode_of) + 1 if decode_of else 0  # decode rows cover slots 0 .. hi - 1
        prefill = [a for a in admitted if a.leader is None and len(a.seq) - a.start > 1]
        # prompt positions logprob_start .. len - 2 give the logprobs of tokens logprob_start + 1 ..
        scoring = {j: (a.req.logprob_start - a.start, len(a.req.input_ids) - 1 - a.req.logprob_start)
                   for j, a in enumerate(prefill) if a.req.scores_prompt}
        lora = [self._slots[i].lora if i in decode_of else None for i in range(hi)] + [a.req.lora for a in prefill]
        step = Step([decode_of.get(i) for i in range(hi)], [(a.req.slot, a.start, a.seq[a.start:]) for a in prefill],
                    hidden_from=scoring, lora=lora if any(lora) else [])
        t0 = time.perf_counter()
        logits = self.decoder.forward(step)
        if admitted:
            self.prefill_calls += 1
            self.prefill_s += time.perf_counter() - t0
        else:
            self.decode_s += time.perf_counter() - t0
        if running:
            self.steps += 1
        twins = [a for a in admitted if a.leader is not None]
        self.decoder.copy_prefixes([(a.leader.slot, a.req.slot, len(a.seq)) for a in twins])
        for a in admitted:  # the slot now holds the whole prompt: share it
            a.req.kv_epoch = self._epoch
            if a.leader is None:
                self._cache_slot(a.req, a.seq)
        for j in scoring:
            self._score_prompt(prefill[j].req, step.hidden[j])
        row_of = {id(self._slots[i]): i for i in decode_of}
        row_of.update({id(a.req): hi + j for j, a in enumerate(prefill)})
        row_of.update({id(a.req): row_of[id(a.leader)] for a in twins})
        batch = [self._slots[i] for i in decode_of] + [a.req for a in prefill] + [a.req for a in twins]
        for r in [r for r in batch if r.sampling.max_new_tokens == 0]:  # only its prompt logprobs were asked for
            self._finish(r, {"type": "length", "length": 0})
        batch = [r for r in batch if not r.finished]
        if not batch:
            return
        rows = [row_of[id(r)] for r in batch]
        if rows != list(range(logits.shape[0])):
            logits = logits[torch.tensor(rows, device=logits.device)]
        self._sample_and_append(batch, logits)

    def _score_prompt(self, req: GenRequest, hidden: torch.Tensor) -> None:
        """``req``'s prompt logprobs from the hidden states of positions ``logprob_start ..``;
        a failure is its own (finished with the error), not the step's."""
        try:
            targets = req.input_ids[req.logprob_start + 1:]
            lps, tops = self.decoder.token_logprobs(hidden, targets, req.top_logprobs_num, PROMPT_LOGPROB_CHUNK)
        except Exception as e:
            log.exception("prompt logprobs failed for request %s", req.rid)
            self._fail([req], e)
            return
        req.input_logprobs = [None, *lps]
        req.input_top_logprobs = [None, *tops] if req.top_logprobs_num else []

    def _admit(self) -> list[_Admitted]:
        """Move waiting requests into free slots (lowest first), within the prefill token
        budget, and copy each one's cached prefix into its slot. A request whose tokens equal
        those of one admitted before it in this step is its *twin*: it computes nothing."""
        self._flush_saves()
        self._compact()
        free = [i for i, r in enumerate(self._slots) if r is None]
        admitted: list[_Admitted] = []
        leaders: dict[tuple[LoraWeights | None, tuple[int, ...]], GenRequest] = {}
        deferred: list[GenRequest] = []
        loads: list[tuple[int, list[int]]] = []
        budget = PREFILL_TOKEN_BUDGET
        while self._waiting and len(admitted) < len(free) and len(deferred) <= len(self._slots):
            req = self._waiting[0]
            if req.finished:  # aborted while it waited: dropped here, not searched for then
                self._waiting.popleft()
                continue
            seq = req.input_ids + req.output_ids
            # a request that scores its prompt computes it from logprob_start on, and shares with no twin
            scoring = req.scores_prompt
            leader = leaders.get((req.lora, tuple(seq))) if self.cache is not None and not scoring else None
            entries: list[int] = []
            if leader is None and self.cache is not None and req.lora is None:
                entries = self.cache.match(seq[:-1])
                if scoring:
                    entries = entries[: req.logprob_start]
                elif self._waits_for_batch(seq, len(entries), admitted):
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
            if leader is None and self.cache is not None and not scoring:
                leaders[(req.lora, tuple(seq))] = req
            admitted.append(_Admitted(req, seq, len(entries), leader))
        self._waiting.extendleft(reversed(deferred))
        self.decoder.load_prefixes(loads)
        return admitted

    def _compact(self) -> None:
        """Move the requests of the highest slots into the free slots below them (their
        keys/values copied), so that the running requests hold slots ``0 .. n - 1`` and new ones
        are admitted above: the decode rows are consecutive slots without filler rows, which
        would cost a whole row of the forward pass each (after saves are flushed: they read slots)."""
        moves: list[tuple[int, int, int]] = []
        top = len(self._slots) - 1
        for hole, r in enumerate(self._slots):
            if r is not None:
                continue
            while top > hole and self._slots[top] is None:
                top -= 1
            if top <= hole:
                break
            r = self._slots[top]
            assert r is not None
            # every token but the last sampled one has its keys/values in the slot
            moves.append((top, hole, len(r.input_ids) + len(r.output_ids) - 1))
            self._slots[hole], self._slots[top] = r, None
            r.slot = hole
        self.decoder.copy_prefixes([m for m in moves if m[2] > 0])
        self._sort_slots()

    def _sort_slots(self) -> None:
        """Reorder the running requests (in slots ``0 .. n - 1``) longest first once that pays.
        Decode attention reads each run of neighbouring slots up to its longest row
        (``decoder.decode_segments``), so rows of similar lengths side by side read fewer keys;
        positions all grow by one a step and new requests (the shortest) are admitted above, so
        an order lasts until a request finishes and the highest one is moved into its slot. The
        keys read beyond the sorted order's are summed; when they pass what moving the slots
        would copy (read and written, up to the longest moved one), the slots are sorted."""
        self._steps_checked += 1
        if self._steps_checked % SORT_CHECK_EVERY:
            return
        live = [r for r in self._slots if r is not None]
        positions = [len(r.input_ids) + len(r.output_ids) - 1 for r in live]
        order = sorted(range(len(live)), key=positions.__getitem__, reverse=True)  # stable
        moved = [k for k, i in enumerate(order) if i != k]
        if not moved:
            self._unsorted_keys = 0.0
            return
        now, best = decode_segments(positions)[1], decode_segments([positions[i] for i in order])[1]
        self._unsorted_keys += SORT_CHECK_EVERY * (now - best)
        longest = max(positions[order[k]] for k in moved) + 1
        if self._unsorted_keys < 2 * len(moved) * longest:
            return
        self._unsorted_keys = 0.0
        self.decoder.copy_prefixes([(live[order[k]].slot, k, longest) for k in moved])
        for k, i in enumerate(order):
            self._slots[k] = live[i]
            live[i].slot = k

    @staticmethod
    def _waits_for_batch(seq: list[int], cached: int, admitted: list[_Admitted]) -> bool:
        """Whether a request admitted earlier in this step will cache enough of ``seq``
        (all but its last token, or ``SHARED_PREFIX_WAIT`` more tokens) to wait a step for it
        (one with a LoRA adapter caches nothing)."""
        want = len(seq) - 1
        if want <= cached:
            return False
        ahead = min(want, cached + SHARED_PREFIX_WAIT)
        head = seq[:ahead]
        return any(a.req.lora is None and a.seq[:ahead] == head for a in admitted)

    def _sample_and_append(self, batch: list[GenRequest], logits: torch.Tensor) -> None:
        """Sample one token per request and append it. If sampling the batch raises, each row
        is sampled alone and only the rows that fail are finished (with their error)."""
        try:
            results = list(zip(batch, *self._sample(batch, logits), strict=True))
        except Exception:
            log.exception("sampling a batch of %d failed; sampling its rows one by one", len(batch))
            results = []
            for i, r in enumerate(batch):
                try:
                    results.append((r, *(col[0] for col in self._sample([r], logits[i : i + 1]))))
                except Exception as e:
                    self._fail([r], e)
        for r, tok, lp, top in results:
            try:
                self._append(r, tok, lp, top)
            except Exception as e:
                log.exception("request %s failed after sampling", r.rid)
                self._fail([r], e)

    def _sample(self, batch: list[GenRequest], logits: torch.Tensor) -> tuple[list[int], list[float], list]:
        """Tokens, their logprobs and (per row) the top (logprob, id) pairs; pure (no request is changed)."""
        dev = logits.device
        shaped = [i for i, r in enumerate(batch) if _penalised(r)]
        if shaped:
            idx = torch.tensor(shaped, device=dev)
            logits = logits.index_copy(0, idx, self._penalise([batch[i] for i in shaped], logits[idx]))
        settings = [(r.sampling.temperature, r.sampling.top_k, r.sampling.top_p, r.sampling.min_p) for r in batch]
        if settings.count(settings[0]) == len(settings):  # the usual case: one setting for the batch
            settings = settings[:1]
        t, k, p, m = zip(*settings, strict=True)
        temperature = torch.tensor(t, dtype=torch.float32, device=dev).expand(len(batch))
        top_k = torch.tensor(k, dtype=torch.long, device=dev).expand(len(batch))
        top_p = torch.tensor(p, dtype=torch.float32, device=dev).expand(len(batch))
        min_p = torch.tensor(m, dtype=torch.float32, device=dev).expand(len(batch)) if any(m) else None
        uniform = torch.tensor([r.rng.random() for r in batch], dtype=torch.float32, device=dev)
        top_n = max(r.top_logprobs_num for r in batch)
        tokens, logprobs, top = sample_rows(logits, temperature, top_k, top_p, uniform, top_n, min_p=min_p)
        tops: list = [None] * len(batch)
        if top is not None:
            vals, ids = top[0].tolist(), top[1].tolist()
            tops = [[(v, t) for v, t in zip(vals[i][: r.top_logprobs_num], ids[i][: r.top_logprobs_num], strict=True)
                     if v != float("-inf")] for i, r in enumerate(batch)]  # kept tokens only
        return tokens.tolist(), logprobs.tolist(), tops

    def _penalise(self, rows: list[GenRequest], logits: torch.Tensor) -> torch.Tensor:
        """Penalties, ``min_new_tokens`` and logit bias of ``rows`` (``sampling.penalize``)."""
        dev, V = logits.device, logits.shape[1]
        counts = torch.zeros(len(rows), V, device=dev)
        which = [j for j, r in enumerate(rows) for _ in r.output_ids]
        if which:
            tokens = torch.tensor([t for r in rows for t in r.output_ids], device=dev)
            counts.index_put_((torch.tensor(which, device=dev), tokens), torch.ones(len(which), device=dev),
                              accumulate=True)
        banned = bias = None
        for j, r in enumerate(rows):
            if len(r.output_ids) < r.sampling.min_new_tokens:
                if banned is None:
                    banned = torch.zeros(len(rows), V, dtype=torch.bool, device=dev)
                ids = [t for t in self.eos_token_ids | set(r.sampling.stop_token_ids) if 0 <= t < V]
                banned[j, ids] = True
            if r.sampling.logit_bias:
                if bias is None:
                    bias = torch.zeros(len(rows), V, device=dev)
                ids = [t for t in r.sampling.logit_bias if t < V]
                bias[j, ids] = torch.tensor([r.sampling.logit_bias[t] for t in ids], device=dev)

        def column(name: str) -> torch.Tensor:
            return torch.tensor([getattr(r.sampling, name) for r in rows], dtype=torch.float32, device=dev)
        return penalize(logits, counts, column("frequency_penalty"), column("presence_penalty"),
                        column("repetition_penalty"), banned, bias)

    def _append(self, r: GenRequest, tok: int, logprob: float, top: list[tuple[float, int]] | None) -> None:
        r.output_ids.append(tok)
        r.logprobs.append(logprob)
        r.versions.append(self.weight_version)
        if r.top_logprobs_num:
            r.top_logprobs.append(top or [])
        self.generated_tokens += 1
        reason = self._stop_reason(r, tok)
        if reason is not None:
            self._finish(r, reason)
        elif r.stream and len(r.output_ids) % r.stream_interval == 0:
            self._notify(r, False)

    def _stop_reason(self, r: GenRequest, tok: int) -> dict[str, Any] | None:
        sp = r.sampling
        if not sp.ignore_eos and (tok in self.eos_token_ids or tok in sp.stop_token_ids):
            return {"type": "stop", "matched": tok}
        if sp.stop or sp.stop_regex:
            text = self.decode_text(r.output_ids)
            hits = [(text.find(s), s) for s in sp.stop if s and s in text]
            if hits:
                return {"type": "stop", "matched": min(hits)[1]}
            for pattern in sp.stop_regex:  # (patterns were compiled once by validation; re caches them)
                if re.search(pattern, text):
                    return {"type": "stop", "matched": pattern}
        if len(r.output_ids) >= sp.max_new_tokens:
            return {"type": "length", "length": sp.max_new_tokens}
        if len(r.input_ids) + len(r.output_ids) >= self.context_length:
            return {"type": "length", "length": len(r.output_ids)}
        return None


def _penalised(r: GenRequest) -> bool:
    sp = r.sampling
    return bool(sp.frequency_penalty or sp.presence_penalty or sp.repetition_penalty != 1.0 or sp.logit_bias
                or len(r.output_ids) < sp.min_new_tokens)

"""The continuous-batching engine behind ``agentrl serve``.

What it is: one thread that owns a ``Decoder`` (weights + slot KV cache) and loops: apply
queued commands (new requests, aborts, pause/continue, weight swaps), prefill newly admitted
requests into free slots, then run one decode step for every running request together.
Requests join and leave the batch at every step, so no request waits for another to finish.
Everything that touches the model runs on that thread; other threads talk to it only
through ``submit``/``abort``/``pause``/``resume``/``install_weights`` (thread-safe), and hear
back through each request's ``notify`` callback, which runs on the engine thread and must
only hand the news over (e.g. ``loop.call_soon_threadsafe``).

Pause modes (SGLang's): ``abort`` finishes every running and queued request with
``finish_reason`` abort and its partial output; ``retract`` frees the slots of running
requests and puts them back at the head of the queue, to be re-prefilled (prompt + output so
far) after ``resume`` — under the new weights if they changed; ``in_place`` just stops
stepping. While paused nothing new is admitted (new requests wait in the queue).

A weight swap happens between two steps: every token sampled afterwards comes from the new
weights and carries the new version (requests still running keep their KV cache from the
old weights, as SGLang's in-place update does).

What it is not: a prefix cache, speculative decoding, chunked prefill or multi-GPU.
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
from typing import Any

import torch

from agentrl.api import SamplingParams
from agentrl.inference.decoder import Decoder
from agentrl.inference.sampling import sample_rows

log = logging.getLogger(__name__)

PREFILL_TOKEN_BUDGET = 4096
"""Most (padded) prompt tokens prefilled in one forward call: bounds how long a pause or a
running batch waits behind a burst of long prompts."""


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

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Engine:
    """Continuous batching over ``num_slots`` KV-cache slots; see the module docstring."""

    def __init__(self, decoder: Decoder, *, eos_token_ids: set[int], decode_text: Callable[[list[int]], str],
                 weight_version: str = "default", seed: int = 0) -> None:
        self.decoder = decoder
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
        self.steps = 0
        self.generated_tokens = 0
        self.prefill_calls = 0
        self.prefill_s = 0.0  # wall time in prefill forward passes
        self.decode_s = 0.0  # wall time in decode steps

    # ------------------------------------------------------------------ thread-safe API

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._commands.put(lambda: None)
        self._thread.join(timeout=10)

    def submit(self, req: Request) -> None:
        """Queue a request. Its ``notify`` is called when it finishes (and per step if streaming)."""
        self._commands.put(lambda: self._admit_to_queue(req))

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
        """Swap in weights prepared by ``Decoder.prepare_weights`` between two steps."""
        def run() -> None:
            if abort_all:
                for r in list(self._live.values()):
                    self._abort(r, "Aborted by a weight update")
            self.decoder.weights = weights
            if version is not None:
                self.weight_version = version
        return self._call(run)

    @property
    def alive(self) -> bool:
        """The engine thread is running (a dead engine makes ``/health`` answer 503)."""
        return self._thread.is_alive()

    def load(self) -> dict[str, int]:
        running = sum(1 for r in self._slots if r is not None)
        return {"num_running_reqs": running, "num_waiting_reqs": len(self._live) - running}

    def tokens_in_use(self) -> int:
        """Prompt + output tokens of the requests in slots (what SGLang's ``/get_load`` calls num_tokens)."""
        return sum(len(r.input_ids) + len(r.output_ids) for r in self._slots if r is not None)

    def is_live(self, rid: str) -> bool:
        return rid in self._live

    # ------------------------------------------------------------------ engine thread

    def _call(self, fn: Callable[[], None]) -> Future:
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
        req.rng = random.Random(seed if seed is not None else self._rng.getrandbits(64))
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
                self._slots[r.slot] = None
                r.slot = None
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
            self._slots[req.slot] = None
            req.slot = None
        if req in self._waiting:
            self._waiting.remove(req)
        self._live.pop(req.rid, None)
        self._notify(req, True)

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
                t0 = time.perf_counter()
                if self._prefill_waiting():
                    self.prefill_calls += 1
                    self.prefill_s += time.perf_counter() - t0
                if any(r is not None for r in self._slots):
                    t0 = time.perf_counter()
                    self._decode_step()
                    self.decode_s += time.perf_counter() - t0
            except Exception as e:  # keep serving: fail the requests in the batch, not the server
                log.exception("engine step failed")
                for r in [r for r in self._slots if r is not None]:
                    self._finish(r, {"type": "abort", "message": f"engine error: {e}", "status_code": 500,
                                     "err_type": "InternalServerError"})

    def _prefill_waiting(self) -> bool:
        free = [i for i, r in enumerate(self._slots) if r is None]
        batch: list[Request] = []
        longest = 0
        while self._waiting and free:
            req = self._waiting[0]
            n = len(req.input_ids) + len(req.output_ids)
            if batch and max(longest, n) * (len(batch) + 1) > PREFILL_TOKEN_BUDGET:
                break
            self._waiting.popleft()
            req.slot = free.pop(0)
            self._slots[req.slot] = req
            req.started = True
            longest = max(longest, n)
            batch.append(req)
        if not batch:
            return False
        dev = self.decoder.device
        tokens = torch.zeros(len(batch), longest, dtype=torch.long)
        for i, r in enumerate(batch):
            seq = r.input_ids + r.output_ids
            tokens[i, : len(seq)] = torch.tensor(seq)
        positions = torch.arange(longest).expand(len(batch), longest)
        last = torch.tensor([len(r.input_ids) + len(r.output_ids) - 1 for r in batch])
        slots = torch.tensor([r.slot for r in batch])
        logits = self.decoder.forward(tokens.to(dev), positions.to(dev), slots.to(dev), logit_index=last.to(dev))
        self._sample_and_append(batch, logits)
        return True

    def _decode_step(self) -> None:
        hi = max(i for i, r in enumerate(self._slots) if r is not None) + 1
        rows = self._slots[:hi]
        toks, pos = [0] * hi, [0] * hi  # free slots in range compute a throwaway row at position 0
        for i, r in enumerate(rows):
            if r is not None:
                toks[i] = r.output_ids[-1]
                pos[i] = len(r.input_ids) + len(r.output_ids) - 1
        dev = self.decoder.device
        tokens = torch.tensor(toks, device=dev).view(hi, 1)
        positions = torch.tensor(pos, device=dev).view(hi, 1)
        logits = self.decoder.forward(tokens, positions, slice(0, hi))[:, 0]
        active = [i for i, r in enumerate(rows) if r is not None]
        if len(active) < hi:
            logits = logits[torch.tensor(active, device=dev)]
        self._sample_and_append([rows[i] for i in active], logits)
        self.steps += 1

    def _sample_and_append(self, batch: list[Request], logits: torch.Tensor) -> None:
        dev = logits.device
        temperature = torch.tensor([r.sampling.temperature for r in batch], dtype=torch.float32, device=dev)
        top_k = torch.tensor([r.sampling.top_k for r in batch], dtype=torch.long, device=dev)
        top_p = torch.tensor([r.sampling.top_p for r in batch], dtype=torch.float32, device=dev)
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

"""What the routes of ``agentrl serve`` share: the live server state.

What it is: ``ServerState``, built from a ``ServeConfig`` (``agentrl.inference.serve_config``):
the engine (started and stopped by the app's lifespan), the tokenizer, the served model's
facts and the ``Bounds`` requests are checked against — plus the ways a handler reaches the engine: ``tokenize``
(a long text on a worker thread, one too long for the context refused before it is
tokenized), ``admit`` (the queue limit), ``run`` (until a request finishes) and ``stream``
(token by token). A client that disconnects aborts its requests. It also holds the copy that
``/update_weights_from_disk``'s ``agentrl_stage_only`` prepared before a pause (``stage``,
``take_staged``) until the update of the same path serves it, and the LoRA adapters loaded by
``/load_lora_adapter`` by name (``loras``, ``lora``), read from disk by ``read_adapter_files``
on a thread of their own (a FIFO or a hung file system holds that thread, never the worker
pool that tokenizes and stages weight updates), one at a time, within ``ADAPTER_READ_TIMEOUT_S``.
What it is not: the
routes (``native_routes``, ``openai_routes``) or the app (``app``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from fastapi import Request

from agentrl.errors import ConfigError, ModelError, Refused
from agentrl.inference.lora_adapter import LoraWeights
from agentrl.inference.prefix_cache import PrefixCache
from agentrl.inference.scheduler import GenRequest, Scheduler
from agentrl.inference.serve_config import DEFAULT_CONTEXT_LENGTH, DEFAULT_PREFIX_CACHE_TOKENS, ServeConfig
from agentrl.inference.validation import Bounds

ADAPTER_READ_TIMEOUT_S = 120.0
"""Seconds an adapter directory may take to read before ``/load_lora_adapter`` gives up on it."""

T = TypeVar("T")

LONG_TEXT = 8192
"""Texts longer than this many characters are tokenized on a worker thread."""


class ServerState:
    """What the route handlers share: the engine, the tokenizer and the served model's facts."""

    def __init__(self, config: ServeConfig) -> None:
        import torch
        from transformers import AutoTokenizer, GenerationConfig

        from agentrl.inference.decoder import Decoder, read_config

        if config.threads:
            torch.set_num_threads(config.threads)
        self.config = config
        self.model_path = config.model
        hf_config = read_config(config.model)
        if config.context_length and config.context_length > hf_config.max_position_embeddings:
            raise ConfigError(f"--context-length {config.context_length} is longer than this model's "
                              f"max_position_embeddings ({hf_config.max_position_embeddings}): positions past it "
                              f"were never trained; give at most {hf_config.max_position_embeddings}")
        context = config.context_length or min(hf_config.max_position_embeddings, DEFAULT_CONTEXT_LENGTH)
        pool = 0 if config.disable_radix_cache else (
            config.prefix_cache_tokens or min(config.max_running_requests * context, DEFAULT_PREFIX_CACHE_TOKENS))
        self.decoder = Decoder(config.model, num_slots=config.max_running_requests, max_len=context,
                               device=config.device, pool_tokens=pool,
                               batch_invariant=config.enable_deterministic_inference,
                               prepack=config.prepack_weights)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(config.model)
        except Exception as e:
            raise ModelError(f"{config.model}: cannot load its tokenizer ({type(e).__name__}); check "
                             "tokenizer.json / tokenizer_config.json") from None
        eos: set[int] = set()
        for source in (hf_config, _generation_config(GenerationConfig, config.model)):
            ids = getattr(source, "eos_token_id", None) if source is not None else None
            eos.update([ids] if isinstance(ids, int) else list(ids or []))
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = eos
        self.vocab_size = hf_config.vocab_size
        self.model_type = hf_config.model_type
        self.architectures = list(getattr(hf_config, "architectures", None) or [])
        self.scheduler = Scheduler(self.decoder, eos_token_ids=eos, decode_text=self.decode,
                             weight_version=config.weight_version, seed=config.seed,
                             prefix_cache=PrefixCache(pool) if pool else None)
        self.bounds = Bounds(context_length=context, vocab_size=self.vocab_size, max_n=config.max_n,
                             max_top_logprobs=config.max_top_logprobs_num)
        # the most UTF-8 bytes one token can stand for (x 2 for normalizers that shrink text):
        # a text of more than context x this many bytes cannot fit, whatever its tokens
        longest = max((len(str(t).encode()) for t in self.tokenizer.get_vocab()), default=1)
        self.bytes_per_token_bound = 2 * max(longest, 4)
        self.weight_lock = asyncio.Lock()  # weight updates one at a time (each stages on the served weights)
        self._staged: StagedFromDisk | None = None  # /update_weights_from_disk's agentrl_stage_only copy
        self.loras: dict[str, LoraWeights] = {}  # /load_lora_adapter's adapters, by lora_name (event loop only)
        self._adapter_reads = asyncio.Semaphore(1)
        self.started = time.time()

    def stage(self, path: str, weights: dict) -> None:
        """Keep ``weights`` (prepared from ``path`` over the served weights) for the update of the
        same path that follows (under ``weight_lock``); a copy staged before is dropped."""
        self.take_staged(None)
        self._staged = StagedFromDisk(path, _files_signature(path), weights, self.decoder.weights)

    def take_staged(self, path: str | None) -> dict | None:
        """The staged copy if it was prepared from ``path``, the directory's files are unchanged
        and the served weights are still those it was laid over; else None, and a staged copy
        is dropped (under ``weight_lock``)."""
        staged, self._staged = self._staged, None
        if staged is None:
            return None
        if (staged.path == path and staged.origin is self.decoder.weights
                and staged.signature == _files_signature(path)):
            return staged.weights
        self.decoder.discard(staged.weights)
        return None

    async def read_adapter_files(self, fn: Callable[..., T], *args: Any,
                                 timeout_s: float = ADAPTER_READ_TIMEOUT_S) -> T:
        """``fn(*args)`` on a daemon thread of its own, one call at a time; a ``Refused`` (504) when
        it runs past ``timeout_s`` (the thread is left to its read; the next call waits for it)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()

        def settle(value: Any, error: BaseException | None) -> None:
            if not done.done():
                done.set_exception(error) if error is not None else done.set_result(value)

        def work() -> None:
            try:
                value, error = fn(*args), None
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting route
                value, error = None, e
            loop.call_soon_threadsafe(settle, value, error)
            loop.call_soon_threadsafe(self._adapter_reads.release)

        try:
            async with asyncio.timeout(timeout_s):
                await self._adapter_reads.acquire()
                threading.Thread(target=work, name="adapter-read", daemon=True).start()
                return await done
        except TimeoutError:
            raise Refused(f"reading the adapter took more than {timeout_s:g} s (a hung file system, or a file "
                          "that never ends?); the next load waits for that read to end", 504) from None

    def lora(self, name: str | None) -> LoraWeights | None:
        """The adapter loaded as ``name`` (None: none); an unknown name is refused (400) in SGLang's words."""
        if name is None:
            return None
        found = self.loras.get(name)
        if found is None:
            raise Refused(f"The following requested LoRA adapters are not loaded: {name[:200]}. Loaded adapters: "
                          f"{sorted(self.loras)}; load it first (POST /load_lora_adapter)")
        return found

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @property
    def served_model_name(self) -> str:
        return self.config.served_model_name or self.model_path

    async def tokenize(self, text: str) -> list[int]:
        """``text``'s token ids; a long one on a worker thread (the event loop keeps serving),
        and one that cannot fit the context is refused without being tokenized."""
        try:
            if len(text) <= LONG_TEXT:
                return self.tokenizer.encode(text, add_special_tokens=False)
            size, ctx = len(text.encode("utf-8", "surrogatepass")), self.bounds.context_length
            if size // self.bytes_per_token_bound >= ctx:
                raise Refused(f"The input (at least {size // self.bytes_per_token_bound} tokens: {size} bytes) "
                                 f"is longer than the model's context length ({ctx} tokens).")
            return await asyncio.to_thread(self.tokenizer.encode, text, add_special_tokens=False)
        except (TypeError, ValueError, UnicodeError) as e:  # e.g. a lone surrogate from a JSON escape
            raise Refused(f"the text could not be tokenized ({type(e).__name__}); send valid Unicode") from e

    def admit(self, count: int) -> None:
        """Refuse (503) ``count`` more requests if they would pass ``max_queued_requests``."""
        cap = self.config.max_queued_requests
        if count > cap:
            raise Refused(f"this request asks for {count} samples (prompts x n), more than this server ever "
                             f"holds at once (--max-queued-requests {cap}); split it")
        if self.scheduler.num_live + count > cap:
            raise Refused(f"The request queue is full: {self.scheduler.num_live} requests are waiting or running "
                             f"and this one adds {count} (--max-queued-requests {cap}); retry later", status=503)

    async def run(self, req: GenRequest, http: Request | None = None) -> GenRequest:
        """Submit and wait until finished; a disconnected client aborts the request."""
        return (await self.run_all([req], http))[0]

    async def run_all(self, reqs: list[GenRequest], http: Request | None = None) -> list[GenRequest]:
        """Submit ``reqs`` together and wait until all finished; a disconnected client aborts
        them. The scheduler thread wakes the event loop once, when the last one finishes."""
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        left = [len(reqs)]
        lock = threading.Lock()

        def finished(_: GenRequest, fin: bool) -> None:  # scheduler thread
            if fin:
                with lock:
                    left[0] -= 1
                    last = left[0] == 0
                if last:
                    loop.call_soon_threadsafe(done.set)
        for r in reqs:
            r.notify = finished
        self.scheduler.submit(*reqs)
        try:
            while not done.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await done.wait()
                if not done.is_set() and http is not None and await http.is_disconnected():
                    self.scheduler.abort_requests(reqs, message="client disconnected")
                    await done.wait()
        except asyncio.CancelledError:
            self.scheduler.abort_requests(reqs, message="client disconnected")
            raise
        return reqs

    async def stream(self, req: GenRequest):
        """Yield ``(num_tokens, finished)`` as the engine produces tokens; abort if abandoned."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[int, bool]] = asyncio.Queue()
        req.stream = True
        req.notify = lambda r, fin: loop.call_soon_threadsafe(events.put_nowait, (len(r.output_ids), fin))
        self.scheduler.submit(req)
        finished = False
        try:
            while not finished:
                n, finished = await events.get()
                while not events.empty() and not finished:  # coalesce a backlog
                    n, finished = events.get_nowait()
                yield n, finished
        finally:
            if not finished:
                self.scheduler.abort_requests([req], message="client disconnected")


@dataclass
class StagedFromDisk:
    """Weights prepared before the pause (``agentrl_stage_only``), awaiting the update that serves them."""

    path: str
    signature: tuple  # the directory's files (name, size, mtime) when they were read
    weights: dict
    origin: dict  # the served weights they were laid over: another update since voids them


def _files_signature(path: str | None) -> tuple:
    try:
        return tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in Path(path).iterdir()
                            if f.is_file())) if path else ()
    except OSError:
        return ()


def _generation_config(cls, path: str):
    try:
        return cls.from_pretrained(path)
    except Exception:  # a checkpoint without generation_config.json is fine
        return None

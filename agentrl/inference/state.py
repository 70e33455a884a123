"""What the routes of ``agentrl serve`` share: its settings and the live server state.

What it is: ``ServeConfig`` (the CLI flags) and ``ServerState`` — the engine (started and
stopped by the app's lifespan), the tokenizer and the served model's facts — plus the two
ways a handler waits on the engine: ``run`` (until a request finishes) and ``stream`` (token
by token). A client that disconnects aborts its requests. What it is not: the routes
(``native_routes``, ``openai_routes``) or the app (``app``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass

from fastapi import Request

from agentrl.config import option
from agentrl.errors import ModelError
from agentrl.inference.engine import Engine
from agentrl.inference.engine import Request as EngineRequest
from agentrl.inference.prefix_cache import PrefixCache

DEFAULT_PREFIX_CACHE_TOKENS = 32768


@dataclass
class ServeConfig:
    """Settings of one ``agentrl serve`` process (the CLI flags)."""

    model: str = option(help="Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer)")
    host: str = option("127.0.0.1", help="address to listen on")
    port: int = option(30000, help="port to listen on (SGLang's default)", ge=0, le=65535)
    device: str = option("cpu", help="where the model runs", choices=("cpu", "cuda"))
    max_running_requests: int = option(64, help="KV-cache slots: requests decoded together", ge=1)
    context_length: int | None = option(
        None, help="longest prompt + output in tokens; default min(model's max positions, 4096)", ge=2)
    threads: int | None = option(None, help="torch CPU threads (default: torch's choice)", ge=1)
    weight_version: str = option("default", help="initial weight version (SGLang's --weight-version)")
    served_model_name: str | None = option(None, help="model id in /v1/models (default: the model path)")
    seed: int = option(0, help="seed of the engine's RNG for requests without a sampling_seed")
    disable_radix_cache: bool = option(False, help="no prefix cache: every prompt is computed in full "
                                       "(SGLang's --disable-radix-cache)")
    prefix_cache_tokens: int | None = option(
        None, help="tokens of KV the prefix cache keeps before evicting the least recently used; "
        "default min(max_running_requests x context_length, 32768)", ge=1)


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
        context = config.context_length or min(hf_config.max_position_embeddings, 4096)
        pool = 0 if config.disable_radix_cache else (
            config.prefix_cache_tokens or min(config.max_running_requests * context, DEFAULT_PREFIX_CACHE_TOKENS))
        self.decoder = Decoder(config.model, num_slots=config.max_running_requests, max_len=context,
                               device=config.device, pool_tokens=pool)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(config.model)
        except Exception as e:
            raise ModelError(f"{config.model}: cannot load its tokenizer ({e})") from e
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
        self.engine = Engine(self.decoder, eos_token_ids=eos, decode_text=self.decode,
                             weight_version=config.weight_version, seed=config.seed,
                             prefix_cache=PrefixCache(pool) if pool else None)
        self.started = time.time()

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @property
    def served_model_name(self) -> str:
        return self.config.served_model_name or self.model_path

    async def run(self, req: EngineRequest, http: Request | None = None) -> EngineRequest:
        """Submit and wait until finished; a disconnected client aborts the request."""
        return (await self.run_all([req], http))[0]

    async def run_all(self, reqs: list[EngineRequest], http: Request | None = None) -> list[EngineRequest]:
        """Submit ``reqs`` together and wait until all finished; a disconnected client aborts
        them. The engine thread wakes the event loop once, when the last one finishes."""
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        left = [len(reqs)]
        lock = threading.Lock()

        def finished(_: EngineRequest, fin: bool) -> None:  # engine thread
            if fin:
                with lock:
                    left[0] -= 1
                    last = left[0] == 0
                if last:
                    loop.call_soon_threadsafe(done.set)
        for r in reqs:
            r.notify = finished
        self.engine.submit(*reqs)
        try:
            while not done.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await done.wait()
                if not done.is_set() and http is not None and await http.is_disconnected():
                    for r in reqs:
                        self.engine.abort(r.rid, message="client disconnected")
                    await done.wait()
        except asyncio.CancelledError:
            for r in reqs:
                self.engine.abort(r.rid, message="client disconnected")
            raise
        return reqs

    async def stream(self, req: EngineRequest):
        """Yield ``(num_tokens, finished)`` as the engine produces tokens; abort if abandoned."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[int, bool]] = asyncio.Queue()
        req.stream = True
        req.notify = lambda r, fin: loop.call_soon_threadsafe(events.put_nowait, (len(r.output_ids), fin))
        self.engine.submit(req)
        finished = False
        try:
            while not finished:
                n, finished = await events.get()
                while not events.empty() and not finished:  # coalesce a backlog
                    n, finished = events.get_nowait()
                yield n, finished
        finally:
            if not finished:
                self.engine.abort(req.rid, message="client disconnected")


def _generation_config(cls, path: str):
    try:
        return cls.from_pretrained(path)
    except Exception:  # a checkpoint without generation_config.json is fine
        return None

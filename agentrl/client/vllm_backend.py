"""``VLLMBackend``: vLLM's token-in/token-out and RL routes (0.32+), as ``RemoteEngine`` speaks them.

What it is: the ``EngineBackend`` of a vLLM server started with ``--enable-scale-out`` and
``VLLM_SERVER_DEV_MODE=1``, and its wire vocabulary: exact token ids and per-token logprobs out
of ``POST /inference/v1/generate`` (``vllm/entrypoints/scale_out/token_in_token_out/protocol.py``;
one prompt per request: no batch form), the version spans vLLM tags output tokens with, the
control routes of ``vllm/entrypoints/rl/online/api_router.py`` (``/pause?mode=abort``,
``/resume``, ``/update_weight_version``, ``/weight_info``, ``/sleep``, ``/wake_up``) and
``/collective_rpc`` (``reload_weights`` from a checkpoint directory, through agentrl's worker
extension where the server has it, and the extension's methods that receive weights over
torch.distributed), scoring for a teacher (``/v1/completions`` with ``prompt_logprobs``,
``/tokenize``), and runtime LoRA (``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``;
a request names its adapter in ``model``). vLLM loads what it is given, so a checkpoint is
checked against the served one here before any server loads it (``checkpoint_check``).

Our sampling vocabulary (SGLang's) maps onto vLLM's name by name; what vLLM has no
equivalent for (``stop_regex``) is refused before a request is sent. What vLLM cannot do —
stage weights while it generates, receive a LoRA adapter by broadcast — raises
``RequestRejected``. What it is not: the client (``remote_engine``), which decides when to
call these.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from agentrl.api import SamplingParams
from agentrl.client import checkpoint_check
from agentrl.client.backend import Call, Sample, Servers, token_versions
from agentrl.errors import RequestRejected, ServerError

log = logging.getLogger(__name__)

GENERATE = "/inference/v1/generate"
PAUSE = "/pause?mode=abort"
RESUME = "/resume"
VERSION = "/update_weight_version"
WEIGHT_INFO = "/weight_info"
RPC = "/collective_rpc"
RESET_PREFIX_CACHE = "/reset_prefix_cache"
LOAD_LORA = "/v1/load_lora_adapter"  # needs VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora
UNLOAD_LORA = "/v1/unload_lora_adapter"
SLEEP = "/sleep?level=1&mode=abort"  # level 1: weights offloaded to CPU, KV cache discarded
WAKE_WEIGHTS = "/wake_up?tags=weights"
WAKE_KV_CACHE = "/wake_up?tags=kv_cache"  # the last tag: vLLM resumes scheduling once all are back


def sampling_params(sp: SamplingParams, n: int = 1) -> dict[str, Any]:
    """vLLM's ``SamplingParams`` for ours (``logprobs: 0``: the sampled token's logprob)."""
    if sp.stop_regex:
        raise RequestRejected("sampling.stop_regex: vLLM has no stop pattern; use stop strings or "
                              "stop_token_ids with inference.engine=vllm", 400)
    out: dict[str, Any] = {"max_tokens": sp.max_new_tokens, "temperature": sp.temperature, "top_p": sp.top_p,
                           "top_k": sp.top_k, "logprobs": 0, "n": n}
    if sp.ignore_eos:
        out["ignore_eos"] = True
    if sp.stop:
        out["stop"] = list(sp.stop)
    if sp.stop_token_ids:
        out["stop_token_ids"] = list(sp.stop_token_ids)
    if sp.seed is not None:
        out["seed"] = sp.seed
    for ours, theirs, neutral in (("min_p", "min_p", 0.0), ("frequency_penalty", "frequency_penalty", 0.0),
                                  ("presence_penalty", "presence_penalty", 0.0),
                                  ("repetition_penalty", "repetition_penalty", 1.0),
                                  ("min_new_tokens", "min_tokens", 0)):
        if getattr(sp, ours) != neutral:
            out[theirs] = getattr(sp, ours)
    if sp.logit_bias:
        out["logit_bias"] = {str(k): v for k, v in sp.logit_bias.items()}
    return out


def generate_body(prompt: list[int], sp: SamplingParams, n: int, rid: str | None,
                  lora: str | None = None) -> dict[str, Any]:
    """``/inference/v1/generate``'s body; ``lora``: the name of a loaded LoRA adapter to generate
    with (vLLM selects it by ``model``)."""
    body: dict[str, Any] = {"token_ids": prompt, "sampling_params": sampling_params(sp, n), "stream": False}
    if rid:
        body["request_id"] = rid
    if lora:
        body["model"] = lora
    return body


def parse_generate(data: Any, n: int, as_version: Callable[[Any], int]) -> list[Sample]:
    """``n`` (tokens, logprobs, versions, finish reason) from a ``/inference/v1/generate``
    answer; the finish reason in SGLang's shape (``{"type": ..., "matched": ...}``)."""
    try:
        choices = sorted(data["choices"], key=lambda c: c["index"])
        if len(choices) != n:
            raise ValueError(f"{len(choices)} choices for n={n}")
        out = []
        for c in choices:
            toks = [int(t) for t in c["token_ids"] or []]
            content = (c.get("logprobs") or {}).get("content") or []
            if len(content) != len(toks) or any(int(e["token_id"]) != t for e, t in zip(content, toks, strict=True)):
                raise ValueError("logprobs.content does not follow token_ids (was the request sent with logprobs: 0?)")
            lps = [float(e["logprob"]) for e in content]
            versions = token_versions(len(toks), as_version(None), c.get("weight_versions"), as_version)
            kind = c.get("finish_reason")
            reason: dict[str, Any] = {"type": kind}
            if kind == "stop" and c.get("stop_reason") is not None:
                reason["matched"] = c["stop_reason"]
            out.append((toks, lps, versions, reason))
        return out
    except (KeyError, TypeError, ValueError) as e:
        raise ServerError(f"{GENERATE} answered an unexpected shape ({e!r}): {str(data)[:300]}") from e


COMPLETIONS = "/v1/completions"
TOKENIZE = "/tokenize"


def score_body(input_ids: list[int]) -> dict[str, Any]:
    """``/v1/completions``' body that returns the log-probability of every prompt token
    (``prompt_logprobs: 0``: the given token's only; vLLM generates at least one token, ignored)."""
    return {"prompt": input_ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}


def parse_scores(data: Any, input_ids: list[int]) -> list[float | None]:
    """The prompt's log-probabilities of a ``score_body`` answer: ``choices[0].prompt_logprobs``,
    None first, then per position ``{token id: {"logprob", "rank", "decoded_token"}}``."""
    try:
        rows = data["choices"][0]["prompt_logprobs"]
        if len(rows) != len(input_ids):
            raise ValueError(f"{len(rows)} prompt positions for {len(input_ids)} tokens")
        return [None if i == 0 and row is None else float(row[str(t)]["logprob"])
                for i, (row, t) in enumerate(zip(rows, input_ids, strict=True))]
    except (KeyError, TypeError, IndexError, ValueError) as e:
        raise ServerError(f"{COMPLETIONS} answered an unexpected shape for prompt_logprobs ({e!r}): "
                          f"{str(data)[:300]}") from e


WORKER_DIR = Path(__file__).resolve().parent / "vllm_worker"
"""On the ``PYTHONPATH`` of a vLLM server agentrl starts: vLLM imports ``WORKER_EXTENSION`` from
it, in vLLM's own environment (``vllm_worker/agentrl_vllm_worker.py``)."""
WORKER_EXTENSION = "agentrl_vllm_worker.WorkerExtension"
"""vLLM's ``--worker-extension-cls`` for a server agentrl starts."""
KEY_MIDDLEWARE = "agentrl_vllm_auth.RequireKey"
"""The key on every route of a vLLM server agentrl starts, its dev-mode routes included
(vLLM's own ``--api-key`` guards only ``/v1``, ``/v2`` and ``/inference``)."""
RELOAD = "agentrl_reload_weights"
"""The worker method ``/collective_rpc`` loads a checkpoint with on a server agentrl started:
vLLM's ``reload_weights`` and a fix of its CPU build (``agentrl/client/vllm_worker``)."""
PLAIN_RELOAD = "reload_weights"
"""vLLM's own, on a server started without agentrl's worker extension."""


GROUP_RANK = "agentrl_weight_group_rank"
"""Worker methods of the extension for weights over torch.distributed: each worker's rank in its
server (a server takes a group rank per worker), join the trainer's group, receive a bucket
(and load them all at the last), leave the group."""
INIT_GROUP = "agentrl_init_weight_group"
RECEIVE = "agentrl_receive_weights"
DESTROY_GROUP = "agentrl_destroy_weight_group"


def rpc_body(method: str, **kwargs: Any) -> dict[str, Any]:
    """``/collective_rpc``'s body: every worker of the server calls ``method(**kwargs)``; the
    answer is ``{"results": [one per worker]}``."""
    return {"method": method, "kwargs": kwargs}


def reload_body(path: str, method: str = RELOAD) -> dict[str, Any]:
    """``/collective_rpc``'s body that makes every worker load the checkpoint at ``path`` in place."""
    return rpc_body(method, weights_path=str(path))


NO_STAGING = ("vLLM cannot {what} while it generates (a /collective_rpc runs inside its engine loop); "
              "can_stage_weights is false there: send the weights in the pause")


class VLLMBackend:
    """vLLM's side of ``RemoteEngine`` (see the module docstring)."""

    owned_by = ("vllm",)
    batch_form = False
    version_route = WEIGHT_INFO
    lora_routes = (LOAD_LORA, UNLOAD_LORA)

    def __init__(self, servers: Servers) -> None:
        self._servers = servers
        self._reload = RELOAD  # the worker method that loads a checkpoint (_load)
        self._reference: str | None = None  # the served checkpoint a new one is checked against

    def sampling_params(self, sp: SamplingParams, n: int = 1) -> dict[str, Any]:
        return sampling_params(sp, n)

    async def generate(self, server: Any, prompt: list[int], each: list[SamplingParams],
                       rid: str | None) -> list[Sample]:
        s = self._servers
        s.stats["posts"] += 1
        lora = s.lora()
        body = generate_body(prompt, each[0], len(each), rid, lora[0] if lora else None)
        parsed = parse_generate(await s.post(server, GENERATE, body, s.timeout), len(each), s.as_version)
        if lora is None:
            return parsed
        return [(toks, lps, [lora[1]] * len(toks), reason) for toks, lps, _, reason in parsed]

    async def prompt_logprobs(self, server: Any, input_ids: list[int]) -> list[float | None]:
        data = await self._servers.post(server, COMPLETIONS, score_body(input_ids), self._servers.timeout)
        return parse_scores(data, input_ids)

    async def tokenize(self, server: Any, text: str) -> list[int]:
        data = await self._servers.post(server, TOKENIZE, {"prompt": text}, self._servers.timeout)
        try:
            return [int(t) for t in data["tokens"]]
        except (KeyError, TypeError, ValueError) as e:
            raise ServerError(f"{TOKENIZE} answered an unexpected shape ({e!r}): {str(data)[:300]}") from e

    # ------------------------------------------------------------------ control

    def pause(self) -> Call:
        return PAUSE, {}

    def resume(self) -> Call:
        return RESUME, {}

    def release_memory(self) -> Call:
        return SLEEP, {}

    def occupy_memory(self, tags: list[str]) -> Call:
        return (WAKE_WEIGHTS if list(tags) == ["weights"] else WAKE_KV_CACHE), {}

    def leave_group(self, group_name: str) -> Call:
        return RPC, rpc_body(DESTROY_GROUP, group_name=group_name)

    # ------------------------------------------------------------------ weights from disk

    async def load_weights(self, path: str, version: int) -> None:
        """The checkpoint checked against the served one (``checkpoint_check``: vLLM cannot refuse
        broken weights), loaded by every server, labelled, and the prefix caches emptied."""
        if self._reference is None:
            self._reference = await self._served_checkpoint()
        await asyncio.to_thread(checkpoint_check.check_checkpoint, path, self._reference)
        await self._load(path, version, self._servers.control)
        await self._reset_prefix_cache()

    async def reload_server(self, server: Any, path: str, version: int) -> None:
        s = self._servers
        await self._load(path, version, lambda route, body: s.post(server, route, body, s.control_timeout))

    async def stage_weights(self, path: str) -> None:
        raise RequestRejected(NO_STAGING.format(what="stage weights"), 400)

    async def _load(self, path: str, version: int, post: Callable[[str, dict[str, Any]], Awaitable[Any]]) -> None:
        """The calls that load a checkpoint from disk and label what it samples next, made with
        ``post(route, body)``: through agentrl's worker extension, or, on a server started
        without it (by hand), through vLLM's own ``reload_weights``."""
        try:
            await post(RPC, reload_body(path, self._reload))
        except ServerError as e:  # vLLM answers an unknown worker method with a 500 naming it
            if self._reload == PLAIN_RELOAD or f"no attribute '{self._reload}'" not in str(e):
                raise
            log.warning("the vLLM server was started without agentrl's worker extension (%s); weights load with "
                        "vLLM's own reload_weights, which on a CPU leaves a tied lm_head on its first weights. "
                        "Start vLLM with --worker-extension-cls %s and %s on PYTHONPATH", e, WORKER_EXTENSION,
                        WORKER_DIR)
            self._reload = PLAIN_RELOAD
            await post(RPC, reload_body(path, self._reload))
        await post(VERSION, {"new_version": str(version)})

    async def _reset_prefix_cache(self) -> None:
        """Empty every server's prefix cache after an update. vLLM answers ``{"success": false}``
        while the aborted requests still hold their blocks; a kept block would serve a resumed
        request keys and values of the old weights, so ask again until every one empties."""
        seconds = self._servers.control_timeout
        deadline = time.monotonic() + seconds
        while True:
            answers = await self._servers.control(RESET_PREFIX_CACHE, {})
            if all(not isinstance(a, dict) or a.get("success", True) for a in answers):
                return
            if time.monotonic() > deadline:
                raise ServerError(f"a vLLM server still held its prefix cache {seconds:.0f} s after a "
                                  "weight update (/reset_prefix_cache kept answering success: false)")
            await asyncio.sleep(0.05)

    async def _served_checkpoint(self) -> str | None:
        """The directory the first server was started on (``/v1/models``' ``root``): new
        checkpoints are compared with it tensor by tensor, if this process can read it."""
        s = self._servers
        try:
            return (await s.get(s.members[0], "/v1/models", min(10.0, s.control_timeout)))["data"][0].get("root")
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
            return None

    # ------------------------------------------------------------------ weights over torch.distributed

    async def _worker_calls(self, method: str, kwargs: list[dict[str, Any]]) -> list[list[Any]]:
        """Every worker of server ``i`` calls the worker extension's ``method(**kwargs[i])``
        (``/collective_rpc``); each server's results, one per worker. A server without agentrl's
        worker extension, or a worker that answers ``{"success": false}``, raises ``RequestRejected``."""
        try:
            answers = await self._servers.every_server(RPC, [rpc_body(method, **kw) for kw in kwargs])
        except ServerError as e:  # vLLM answers an unknown worker method with a 500 naming it
            if f"no attribute '{method}'" not in str(e):
                raise
            raise RequestRejected(
                f"the vLLM server(s) {self._servers.addresses} run without agentrl's worker extension, which weights "
                f"over torch.distributed need: start vLLM with --worker-extension-cls {WORKER_EXTENSION} and "
                f"{WORKER_DIR} on PYTHONPATH (as agentrl train does), or use trainer.weight_sync.transport: "
                "disk", 400) from e
        results = [list(a.get("results") or []) if isinstance(a, dict) else [] for a in answers]
        for server, each in zip(self._servers.members, results, strict=True):
            for r in each:
                if isinstance(r, dict) and r.get("success") is False:
                    raise RequestRejected(f"{server.address}: {r.get('message')}", 400)
        return results

    async def group_ranks(self) -> list[int]:
        """A server takes one group rank per worker."""
        return [len(r) for r in await self._worker_calls(GROUP_RANK, [{}] * len(self._servers.members))]

    async def can_stage(self) -> bool:
        return False

    async def join_group(self, master_address: str, master_port: int, *, group_name: str, group_backend: str,
                         offsets: list[int], world_size: int) -> None:
        await self._worker_calls(INIT_GROUP, [
            {"master_address": master_address, "master_port": master_port, "rank_offset": offset,
             "world_size": world_size, "group_name": group_name, "backend": group_backend,
             "timeout_s": self._servers.control_timeout} for offset in offsets])

    async def begin_update(self) -> None:
        """Nothing: the workers load at an update's last bucket."""

    async def end_update(self) -> None:
        """Nothing (``begin_update``)."""

    async def receive_weights(self, names: list[str], dtypes: list[str], shapes: list[list[int]], *, group_name: str,
                              version: int | None, load_format: str | None, stage_only: bool) -> None:
        """Every worker keeps the buckets it receives and, at the one with ``version``, checks them
        all and loads them at once; then the version is set and the prefix cache emptied, as
        after a load from disk."""
        if stage_only:
            raise RequestRejected(NO_STAGING.format(what="stage weights"), 400)
        n = len(self._servers.members)
        await self._worker_calls(RECEIVE, [
            {"names": names, "dtypes": dtypes, "shapes": shapes, "group_name": group_name,
             "load_format": load_format, "load": version is not None}] * n)
        if version is not None:
            await self._servers.every_server(VERSION, [{"new_version": str(version)}] * n)
            await self._reset_prefix_cache()

    async def commit_staged(self, group_name: str, version: int) -> None:
        raise RequestRejected(NO_STAGING.format(what="stage weights"), 400)

    async def receive_adapter(self, names: list[str], dtypes: list[str], shapes: list[list[int]], *, group_name: str,
                              config: dict[str, Any], load_format: str | None, name: str | None) -> None:
        raise RequestRejected("vLLM receives LoRA adapters from disk only (load_lora_adapter); use "
                              "trainer.weight_sync.transport: disk with inference.engine: vllm", 400)

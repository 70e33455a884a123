"""vLLM's token-in/token-out routes, as ``RemoteEngine`` speaks them.

What it is: the request bodies and answers of a vLLM server (0.32+, started with
``--enable-scale-out`` and ``VLLM_SERVER_DEV_MODE=1``), mapped onto what the client uses
for SGLang-compatible servers — exact token ids and per-token logprobs out of
``POST /inference/v1/generate`` (``vllm/entrypoints/scale_out/token_in_token_out/protocol.py``),
the version spans vLLM tags output tokens with, and the control routes of
``vllm/entrypoints/rl/online/api_router.py`` (``/pause?mode=abort``, ``/resume``,
``/update_weight_version``, ``/weight_info``) and ``/collective_rpc`` (``reload_weights``
from a checkpoint directory, through agentrl's worker extension where the server has it, and
the extension's methods that receive weights over torch.distributed),
and runtime LoRA (``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``; a request names
its adapter in ``model``). What it is not: the client (``remote_engine``), which decides when
to call these.

Our sampling vocabulary (SGLang's) maps onto vLLM's name by name; what vLLM has no
equivalent for (``stop_regex``) is refused before a request is sent.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.api import SamplingParams
from agentrl.errors import RequestRejected, ServerError

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


def parse_generate(data: Any, n: int, as_version: Callable[[Any], int]
                   ) -> list[tuple[list[int], list[float], list[int], dict[str, Any]]]:
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
            versions = [as_version(None)] * len(toks)
            for s in c.get("weight_versions") or []:
                v = as_version(s.get("version"))
                for i in range(int(s.get("start", 0)), min(int(s.get("end", 0)), len(toks))):
                    versions[i] = v
            kind = c.get("finish_reason")
            reason: dict[str, Any] = {"type": kind}
            if kind == "stop" and c.get("stop_reason") is not None:
                reason["matched"] = c["stop_reason"]
            out.append((toks, lps, versions, reason))
        return out
    except (KeyError, TypeError, ValueError) as e:
        raise ServerError(f"{GENERATE} answered an unexpected shape ({e!r}): {str(data)[:300]}") from e


WORKER_DIR = Path(__file__).resolve().parent / "vllm_worker"
"""On the ``PYTHONPATH`` of a vLLM server agentrl starts: vLLM imports ``WORKER_EXTENSION`` from
it, in vLLM's own environment (``vllm_worker/agentrl_vllm_worker.py``)."""
WORKER_EXTENSION = "agentrl_vllm_worker.WorkerExtension"
KEY_MIDDLEWARE = "agentrl_vllm_auth.RequireKey"
"""The key on every route of a vLLM server agentrl starts, its dev-mode routes included
(vLLM's own ``--api-key`` guards only ``/v1``, ``/v2`` and ``/inference``)."""
"""vLLM's ``--worker-extension-cls`` for a server agentrl starts."""
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

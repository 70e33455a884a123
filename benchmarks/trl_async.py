"""The benchmark-side shims that let TRL 1.16's experimental ``AsyncGRPOTrainer``
(``trl.experimental.async_grpo``) run on vLLM's CPU build (0.32), for ``benchmarks/vs_trl.py
--trl-configs vllm-async``. Not part of agentrl: it runs in ``.venv-trl-vllm`` (``make trl-vllm``),
inside vs_trl.py's TRL worker and the rollout process that TRL spawns from it, and patches TRL there
only. The vLLM server is ``trl_vllm.start_server``'s (float32, agentrl's worker extension for the
reload, a key on every route). What each shim replaces, and why TRL as shipped does not run on a CPU:

1. **The FLOPS lookup off.** The trainer asks ``get_peak_flops_per_device`` for the device's peak
   (for its MFU metrics), which calls ``torch.cuda.get_device_name`` ("Torch not compiled with CUDA
   enabled"); here it answers None, which the trainer reads as "unknown" and logs no MFU.
2. **A plain-PyTorch tree attention.** The trainer packs each step's samples into a prefix trie
   and attends with ``flash_attn_varlen_func`` of the FA3 kernel (``packing.py``, ``tree_fa3``),
   CUDA only. ``tree_attention`` below computes the same attention (each trie segment's queries
   against the keys of its root-to-segment path, causal aligned to the path's end) with torch's
   ``scaled_dot_product_attention`` over the segments padded to one length; TRL's packing is
   unchanged.
3. **A response template.** The rollout worker parses each reply with the tokenizer's
   ``response_template`` and knows only the chat templates of published model families; the demo's
   template (``<|assistant|>`` ... ``<|end|>``, no tool calls in the demo) gets ``RESPONSE_TEMPLATE``.
4. **Weight sync through a file.** TRL streams weights over vLLM's NCCL weight-transfer engine
   (CUDA only); the trainer takes any ``weight_transfer=`` backend, and ``FileTransfer`` is one:
   it pauses the server as TRL does (``POST /pause?mode=keep``), writes the trainer's parameters to
   a copy of the checkpoint (``trl_vllm.FileSync``), loads them with agentrl's worker extension's
   ``agentrl_reload_weights`` (which also rebuilds the tied output layer's CPU kernel) and resumes.
   The pause is vLLM's (it empties the prefix cache and preempts the running requests, which
   resume recomputed with the new weights), as with TRL's own sync.
5. **The key in the spawned rollout process.** The rollout worker generates from a child process
   (``mp.get_context("spawn")``) with an ``aiohttp`` session of its own that sends no key. TRL takes
   the loop the child runs from ``AsyncRolloutWorker._loop_cls``; here it is ``KeyedRolloutLoop``,
   TRL's loop whose session sends ``Authorization: Bearer`` with the key it reads from
   ``$VS_TRL_ASYNC_KEY`` (set in the trainer's process, inherited by the child). The trainer's own
   requests go through ``FileTransfer``, which sends the key too.
6. **No seed per request.** The rollout worker gives each request a random seed of its own (so that
   data-parallel engines, seeded alike, draw different samples). The pause of a sync (mode
   ``keep``) preempts the running requests, and when vLLM's CPU build recomputes a seeded one it
   fails ("CPU Generator does not use offset": it cannot rewind a CPU generator) and the engine
   dies; ``KeyedRolloutLoop`` drops the seed, and the server's one engine samples from its own
   generator (seeded by ``--seed``).

The check that the sync works: ``FileTransfer.probe`` asks the server for ``PROBE_SAMPLES`` samples
of one training prompt with their log-probabilities, packs them with TRL's own ``TreeRow`` (as a
training step does), scores them with the trainer's model through the attention above, and keeps
the largest |trainer - sampler| log-probability (``gaps``; the probe's prompt is salted,
``cache_salt``, so that no key-values cached before the sync serve it). It runs after the first
sync (before the training clock starts) and after the last one (vs_trl.py, once training is
over), and vs_trl.py fails the run above its tolerance. Not after every sync: the probe waits in
the server's queue behind the rollout's requests (up to 1,024; 2-3 s on loaded cores), and the
rollout process would go on generating while the trainer waits.
"""

from __future__ import annotations

import os
from typing import Any

import requests
import torch
import trl_vllm
from trl.experimental.async_grpo import async_grpo_trainer, packing
from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker, _AsyncRolloutLoop

KEY_ENV = "VS_TRL_ASYNC_KEY"  # the server's key, for the spawned rollout process
RESPONSE_TEMPLATE = {"defaults": {"role": "assistant"}, "start_anchor": "<|assistant|>",
                     "fields": {"content": {"close_pattern": r"<\|end\|>\s*", "content": "text"}}}
PROBE_SAMPLES = 4
HTTP_TIMEOUT_S = 300


def tree_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                   *, tree_kv_index: torch.Tensor, tree_cu_seqlens_q: torch.Tensor, tree_cu_seqlens_k: torch.Tensor,
                   tree_max_seqlen_q: int, tree_max_seqlen_k: int, scaling: float | None = None,
                   sliding_window: int | None = None, softcap: float | None = None, **_: Any) -> tuple:
    """``packing.tree_attention``'s result without its CUDA kernel: query, key and value come as
    (1, heads, tokens, dim) over the packed trie; segment s's queries see the keys at
    ``tree_kv_index[cu_k[s]:cu_k[s+1]]`` (its path), the last of them aligned with its last query."""
    if sliding_window or softcap:
        raise NotImplementedError("trl_async.tree_attention: no sliding window or softcap (the demo model has neither)")
    q, k, v = (x.transpose(1, 2)[0] for x in (query, key, value))  # (tokens, heads, dim)
    k, v = k.index_select(0, tree_kv_index), v.index_select(0, tree_kv_index)
    q_len, k_len = tree_cu_seqlens_q.diff().long(), tree_cu_seqlens_k.diff().long()
    segments = torch.arange(q_len.numel(), device=q.device)
    seg_q, seg_k = segments.repeat_interleave(q_len), segments.repeat_interleave(k_len)
    off_q = torch.arange(q.shape[0], device=q.device) - tree_cu_seqlens_q[:-1].long()[seg_q]
    off_k = torch.arange(k.shape[0], device=q.device) - tree_cu_seqlens_k[:-1].long()[seg_k]

    def padded(x: torch.Tensor, seg: torch.Tensor, off: torch.Tensor, length: int) -> torch.Tensor:
        # (segments, heads, length, dim)
        return x.new_zeros(len(segments), length, *x.shape[1:]).index_put((seg, off), x).transpose(1, 2)

    i = torch.arange(tree_max_seqlen_q, device=q.device)[None, :, None]
    j = torch.arange(tree_max_seqlen_k, device=q.device)[None, None, :]
    visible = (j <= i + (k_len - q_len)[:, None, None]) & (j < k_len[:, None, None])
    out = torch.nn.functional.scaled_dot_product_attention(
        padded(q, seg_q, off_q, tree_max_seqlen_q), padded(k, seg_k, off_k, tree_max_seqlen_k),
        padded(v, seg_k, off_k, tree_max_seqlen_k), attn_mask=visible[:, None], scale=scaling, enable_gqa=True)
    return out.transpose(1, 2)[seg_q, off_q].unsqueeze(0), None


class KeyedRolloutLoop(_AsyncRolloutLoop):
    """TRL's rollout loop (in the spawned process) with the server's key on its session, and its
    requests without their seed (shim 6)."""

    async def _generate_loop(self, stop_event: Any) -> None:
        self.session.headers["Authorization"] = f"Bearer {os.environ[KEY_ENV]}"
        await super()._generate_loop(stop_event)

    async def _post(self, path: str, payload: dict, timeout: float, max_retries: int = 3) -> dict:  # noqa: ASYNC109 (TRL's signature)
        return await super()._post(path, {k: v for k, v in payload.items() if k != "seed"}, timeout, max_retries)


def patch(key: str) -> None:
    """Shims 1, 2, 5 and 6 (3 and 4 are arguments the trainer takes: ``RESPONSE_TEMPLATE``, ``FileTransfer``)."""
    async_grpo_trainer.get_peak_flops_per_device = lambda accelerator, dtype: None
    packing.tree_attention = tree_attention  # what register_tree_attention (in the trainer's init) registers
    os.environ[KEY_ENV] = key
    AsyncRolloutWorker._loop_cls = KeyedRolloutLoop


async def arith_reward(completions: list, question: list[str], answer: list, **_: Any) -> list[float]:
    """The demo's reward (``agentrl/Arith-v0``), at module level: the rollout process unpickles it."""
    from envs.arith import ArithEnv

    env, rewards = ArithEnv(), []
    for completion, q, a in zip(completions, question, answer, strict=True):
        await env.areset(options={"task": {"question": q, "answer": a}})
        rewards.append((await env.astep(completion[-1]["content"] or ""))[1])
    return rewards


class FileTransfer:
    """TRL's ``WeightTransferProtocol`` through a file, with the key, and the log-probability probe
    (after the first sync here; ``trainer`` is set once the trainer exists)."""

    def __init__(self, url: str, key: str, sync: trl_vllm.FileSync, model_name: str, probe_ids: list[int]) -> None:
        self.url, self.sync, self.model_name, self.probe_ids = url, sync, model_name, probe_ids
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {key}"
        self.trainer: Any = None
        self.gaps: list[float] = []

    def _post(self, path: str, **kwargs: Any) -> Any:
        answer = self.session.post(f"{self.url}{path}", timeout=HTTP_TIMEOUT_S, **kwargs)
        if answer.status_code != 200:
            raise RuntimeError(f"trl_async: POST {path} answered {answer.status_code}: {answer.text[:300]}")
        return answer.json() if answer.content else None

    def init_weight_transfer(self) -> None:
        """Nothing to set up: the server is up (``trl_vllm.start_server`` waited for it)."""

    def pause(self) -> None:
        self._post("/pause", params={"mode": "keep"})

    def send_weights(self, iterator: Any) -> None:
        path = self.sync.write(iterator)
        answer = self._post("/collective_rpc", json={"method": trl_vllm.RELOAD, "args": [path]})
        trl_vllm.check_reload(answer.get("results"), "POST /collective_rpc")

    def resume(self) -> None:
        self._post("/resume")
        if self.sync.syncs == 1:  # the first sync, at train begin
            self.gaps.append(self.probe())

    def destroy(self) -> None:
        """Nothing to tear down (the probe after training still uses the session)."""

    def probe(self) -> float:
        """The largest |trainer - sampler| log-probability over ``PROBE_SAMPLES`` fresh samples."""
        answer = self._post("/v1/completions", json={
            "model": self.model_name, "prompt": self.probe_ids, "n": PROBE_SAMPLES, "max_tokens": 12,
            "temperature": 1.0, "top_p": 1.0, "top_k": 0, "logprobs": 0, "return_token_ids": True,
            "cache_salt": f"probe-{len(self.gaps)}"})
        row = packing.TreeRow()
        for choice in answer["choices"]:
            ids = self.probe_ids + choice["token_ids"]
            mask = [0] * len(self.probe_ids) + [1] * len(choice["token_ids"])
            logps = [0.0] * len(self.probe_ids) + choice["logprobs"]["token_logprobs"]
            row.add({"input_ids": torch.tensor(ids), "completion_mask": torch.tensor(mask),
                     "old_log_probs": torch.tensor(logps), "advantage": 0.0, "group_id": 0})
        packed = row.pack()
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        max_q, max_k = packed["tree_max_seqlens"].tolist()
        with torch.no_grad():
            out = model(input_ids=packed["input_ids"][None], position_ids=packed["position_ids"][None],
                        shift_labels=packed["shift_labels"][None], fused_lm_head=True,
                        tree_kv_index=packed["tree_kv_index"], tree_cu_seqlens_q=packed["tree_cu_seqlens_q"],
                        tree_cu_seqlens_k=packed["tree_cu_seqlens_k"], tree_max_seqlen_q=max_q,
                        tree_max_seqlen_k=max_k)
        trainer_logps = out.log_probs.flatten()[packed["token_index"]]
        return float((trainer_logps - packed["old_log_probs"]).abs().max())

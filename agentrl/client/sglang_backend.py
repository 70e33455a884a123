"""``SGLangBackend``: SGLang's native API (0.5.10-0.5.23) and ``agentrl serve``'s, as ``RemoteEngine`` speaks them.

What it is: the ``EngineBackend`` of a server that speaks SGLang's native routes. Its wire
vocabulary: ``sampling_params`` (the one mapping of ``SamplingParams`` onto SGLang's names:
``seed`` → ``sampling_seed``; only what differs from the defaults is sent), ``POST /generate``
in its plain and batch forms (``generate_body``; with no new tokens and prompt logprobs,
``score_body``, a teacher's scoring; the short requests of one event-loop tick
share one through ``GroupBatcher``) and its answer (``parse_generate``: ``meta_info``'s
``output_token_logprobs`` triples and version spans); the control routes
``/pause_generation``, ``/continue_generation``, ``/update_weights_from_disk``,
``/release_memory_occupation`` and ``/resume_memory_occupation``, ``/load_lora_adapter`` and
``/unload_lora_adapter`` (a request names its adapter in ``lora_path``); the weight group's
``/init_weights_update_group``, ``/update_weights_from_distributed``,
``/destroy_weights_update_group`` and SGLang 0.5.23's ``/begin_weight_update`` session; and
``agentrl serve``'s own staging while it generates (``agentrl_stage_only``,
``/agentrl/commit_staged_weights``, ``/agentrl/lora_adapter_from_distributed``;
``/server_info``'s ``agentrl_staged_weight_updates`` says a server has it).

What it is not: the client (``remote_engine``), nor the server's reading of this format
(``agentrl.inference.validation``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentrl.api import SamplingParams
from agentrl.client.backend import Call, Sample, Servers, token_versions
from agentrl.client.batcher import Group, GroupBatcher
from agentrl.errors import RequestRejected, ServerError

GENERATE = "/generate"
DISK = "/update_weights_from_disk"
DISTRIBUTED = "/update_weights_from_distributed"
ADAPTER_BY_BROADCAST = "/agentrl/lora_adapter_from_distributed"


def sampling_params(sp: SamplingParams, n: int = 1) -> dict[str, Any]:
    """The ``sampling_params`` object of SGLang's ``POST /generate`` (``n`` only when above 1)."""
    out: dict[str, Any] = {"max_new_tokens": sp.max_new_tokens, "temperature": sp.temperature, "top_p": sp.top_p,
                           "top_k": sp.top_k, "ignore_eos": sp.ignore_eos}
    if sp.stop:
        out["stop"] = list(sp.stop)
    if sp.stop_token_ids:
        out["stop_token_ids"] = list(sp.stop_token_ids)
    if sp.seed is not None:
        out["sampling_seed"] = sp.seed
    for name, neutral in (("min_p", 0.0), ("frequency_penalty", 0.0), ("presence_penalty", 0.0),
                          ("repetition_penalty", 1.0), ("min_new_tokens", 0)):
        if getattr(sp, name) != neutral:
            out[name] = getattr(sp, name)
    if sp.stop_regex:
        out["stop_regex"] = list(sp.stop_regex)
    if sp.logit_bias:
        out["logit_bias"] = {str(k): v for k, v in sp.logit_bias.items()}
    if n > 1:
        out["n"] = n
    return out


def generate_body(groups: list[Group], n: int) -> dict[str, Any]:
    """``/generate``'s body for the queued ``groups`` of ``n`` samples each: SGLang's plain form
    for one prompt, its batch form for several (one ``sampling_params`` object when all are
    alike, else one per prompt; ``rid`` only for single samples)."""
    if len(groups) == 1 and (n > 1 or len(groups[0].each) == 1):
        g = groups[0]
        return {"input_ids": g.prompt, "sampling_params": sampling_params(g.each[0], n), "return_logprob": True,
                **({"rid": g.rid} if g.rid and n == 1 else {})}
    if n > 1:
        prompts, sps = [g.prompt for g in groups], [sampling_params(g.each[0], n) for g in groups]
    else:
        prompts = [g.prompt for g in groups for _ in g.each]
        sps = [sampling_params(sp) for g in groups for sp in g.each]
    body: dict[str, Any] = {"input_ids": prompts, "sampling_params": sps[0] if sps.count(sps[0]) == len(sps) else sps,
                            "return_logprob": True}
    if n == 1 and all(g.rid for g in groups):
        body["rid"] = [g.rid for g in groups]
    return body


def score_body(input_ids: list[int] | None = None, text: str | None = None) -> dict[str, Any]:
    """``/generate``'s body that generates nothing and returns the log-probability of every prompt
    token (``logprob_start_len: 0``): of ``input_ids``, or of ``text`` as the server tokenizes it."""
    prompt: dict[str, Any] = {"input_ids": input_ids} if text is None else {"text": text}
    return {**prompt, "sampling_params": {"max_new_tokens": 0, "temperature": 0.0}, "return_logprob": True,
            "logprob_start_len": 0}


def parse_scores(data: Any, input_ids: list[int] | None) -> tuple[list[int], list[float | None]]:
    """The prompt's (token ids, log-probabilities) of a ``score_body`` answer: ``meta_info``'s
    ``input_token_logprobs`` triples (the first log-probability null); checked against ``input_ids``."""
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    try:
        triples = data["meta_info"]["input_token_logprobs"]
        ids = [int(t[1]) for t in triples]
        lps = [None if t[0] is None else float(t[0]) for t in triples]
    except (KeyError, TypeError, IndexError, ValueError) as e:
        raise ServerError(f"{GENERATE} answered an unexpected shape for prompt logprobs ({e!r}): "
                          f"{str(data)[:300]}") from e
    if input_ids is not None and ids != input_ids:
        raise ServerError(f"{GENERATE} scored other tokens than it was sent ({len(ids)} ids for {len(input_ids)}); "
                          "does the server honour logprob_start_len: 0?")
    return ids, lps


def parse_generate(data: Any, as_version: Any) -> Sample:
    """One result object of a ``/generate`` answer: ``meta_info``'s ``output_token_logprobs``
    (logprob, token id, text) triples, its ``finish_reason`` and its version (``weight_version``,
    or the ``weight_versions`` spans of a request that crossed an update)."""
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    try:
        meta = data["meta_info"]
        reason = meta["finish_reason"] or {}
        triples = meta.get("output_token_logprobs")
        if triples is None:
            raise KeyError("meta_info.output_token_logprobs")
        toks = [int(t[1]) for t in triples]
        lps = [float(t[0]) for t in triples]
    except (KeyError, TypeError, IndexError, ValueError) as e:
        raise ServerError(f"{GENERATE} answered an unexpected shape ({e!r}): {str(data)[:300]}") from e
    versions = token_versions(len(toks), as_version(meta.get("weight_version")), meta.get("weight_versions"),
                              as_version)
    return toks, lps, versions, reason


class SGLangBackend:
    """SGLang's and ``agentrl serve``'s side of ``RemoteEngine`` (see the module docstring)."""

    owned_by = ("sglang",)
    batch_form = True
    version_route = "/model_info"
    lora_routes = ("/load_lora_adapter", "/unload_lora_adapter")

    def __init__(self, servers: Servers) -> None:
        self._servers = servers
        self._batcher = GroupBatcher(self._send, max_new_tokens=servers.batch_max_new_tokens)
        self._no_session: set[str] = set()  # servers without SGLang 0.5.23's /begin_weight_update

    def sampling_params(self, sp: SamplingParams, n: int = 1) -> dict[str, Any]:
        return sampling_params(sp, n)

    async def generate(self, server: Any, prompt: list[int], each: list[SamplingParams],
                       rid: str | None) -> list[Sample]:
        answers = await self._batcher.submit(server, prompt, each, rid)
        return [parse_generate(d, self._servers.as_version) for d in answers]

    async def _send(self, server: Any, groups: list[Group], n: int) -> Any:
        s = self._servers
        s.stats["posts"] += 1
        lora = s.lora()
        if lora is None:
            return await s.post(server, GENERATE, generate_body(groups, n), s.timeout)
        name, version = lora  # the adapter is the policy: its version is every token's
        data = await s.post(server, GENERATE, {**generate_body(groups, n), "lora_path": name}, s.timeout)
        for result in data if isinstance(data, list) else [data]:
            meta = result.get("meta_info") if isinstance(result, dict) else None
            if isinstance(meta, dict):
                meta["weight_version"] = str(version)
                meta.pop("weight_versions", None)
        return data

    async def prompt_logprobs(self, server: Any, input_ids: list[int]) -> list[float | None]:
        data = await self._servers.post(server, GENERATE, score_body(input_ids), self._servers.timeout)
        return parse_scores(data, input_ids)[1]

    async def tokenize(self, server: Any, text: str) -> list[int]:
        data = await self._servers.post(server, GENERATE, score_body(text=text), self._servers.timeout)
        return parse_scores(data, None)[0]

    # ------------------------------------------------------------------ control

    def pause(self) -> Call:
        return "/pause_generation", {"mode": "abort"}

    def resume(self) -> Call:
        return "/continue_generation", {}

    def release_memory(self) -> Call:
        return "/release_memory_occupation", {}

    def occupy_memory(self, tags: list[str]) -> Call:
        return "/resume_memory_occupation", {"tags": list(tags)}

    def leave_group(self, group_name: str) -> Call:
        return "/destroy_weights_update_group", {"group_name": group_name}

    # ------------------------------------------------------------------ weights from disk

    async def load_weights(self, path: str, version: int) -> None:
        answers = await self._servers.control(DISK, {"model_path": path, "weight_version": str(version)})
        _raise_unless_success(answers, f"weight update to version {version}")

    async def reload_server(self, server: Any, path: str, version: int) -> None:
        await self._servers.post(server, DISK, {"model_path": path, "weight_version": str(version)},
                                 self._servers.control_timeout)

    async def stage_weights(self, path: str) -> None:
        answers = await self._servers.control(DISK, {"model_path": path, "agentrl_stage_only": True})
        _raise_unless_success(answers, f"staging the weights at {path}")

    # ------------------------------------------------------------------ weights over torch.distributed

    async def _server_info(self, server: Any) -> dict[str, Any]:
        seconds = min(30.0, self._servers.control_timeout)
        info = await self._servers.get(server, "/server_info", seconds)
        if info is None:
            info = await self._servers.get(server, "/get_server_info", seconds)
        return info if isinstance(info, dict) else {}

    async def group_ranks(self) -> list[int]:
        """A server's GPUs: ``tp_size`` x ``pp_size`` of ``/server_info`` (1 for ``agentrl serve``)."""
        infos = await asyncio.gather(*(self._server_info(s) for s in self._servers.members))
        return [int(info.get("tp_size") or 1) * int(info.get("pp_size") or 1) for info in infos]

    async def can_stage(self) -> bool:
        """``agentrl serve`` stages broadcast buckets while it generates; SGLang swaps each in on arrival."""
        infos = await asyncio.gather(*(self._server_info(s) for s in self._servers.members))
        return bool(infos) and all(info.get("agentrl_staged_weight_updates") is True for info in infos)

    async def join_group(self, master_address: str, master_port: int, *, group_name: str, group_backend: str,
                         offsets: list[int], world_size: int) -> None:
        await self._servers.every_server("/init_weights_update_group", [
            {"master_address": master_address, "master_port": master_port, "rank_offset": offset,
             "world_size": world_size, "group_name": group_name, "backend": group_backend} for offset in offsets])

    async def begin_update(self) -> None:
        """SGLang 0.5.23 loads distributed updates only inside a session; older SGLang and
        ``agentrl serve`` have none and answer 404, which is taken as "not needed"."""
        await self._session("/begin_weight_update", {"selector": "all"})

    async def end_update(self) -> None:
        await self._session("/end_weight_update", {})

    async def _session(self, path: str, payload: dict[str, Any]) -> None:
        s = self._servers
        servers = [m for m in s.members if m.address not in self._no_session]
        answers = await asyncio.gather(*(s.post(m, path, payload, s.control_timeout) for m in servers),
                                       return_exceptions=True)
        for m, a in zip(servers, answers, strict=True):
            if isinstance(a, RequestRejected) and a.status_code == 404:
                self._no_session.add(m.address)  # not asked again (a restarted server is the same program)
            elif isinstance(a, BaseException):
                raise a

    async def receive_weights(self, names: list[str], dtypes: list[str], shapes: list[list[int]], *, group_name: str,
                              version: int | None, load_format: str | None, stage_only: bool) -> None:
        payload: dict[str, Any] = {"names": names, "dtypes": dtypes, "shapes": shapes, "group_name": group_name,
                                   "flush_cache": True, "load_format": load_format}
        if stage_only:
            payload["agentrl_stage_only"] = True
        elif version is not None:
            payload["weight_version"] = str(version)
        await self._servers.every_server(DISTRIBUTED, [payload] * len(self._servers.members))

    async def commit_staged(self, group_name: str, version: int) -> None:
        await self._servers.every_server("/agentrl/commit_staged_weights", [
            {"group_name": group_name, "weight_version": str(version), "flush_cache": True}]
            * len(self._servers.members))

    async def receive_adapter(self, names: list[str], dtypes: list[str], shapes: list[list[int]], *, group_name: str,
                              config: dict[str, Any], load_format: str | None, name: str | None) -> None:
        payload = {"names": names, "dtypes": dtypes, "shapes": shapes, "group_name": group_name,
                   "load_format": load_format, "lora_config": config}
        if name is not None:
            payload["lora_name"] = name
        await self._servers.every_server(ADAPTER_BY_BROADCAST, [payload] * len(self._servers.members))


def _raise_unless_success(answers: list[Any], what: str) -> None:
    bad = [a for a in answers if isinstance(a, dict) and not a.get("success", False)]
    if bad:
        raise RequestRejected(f"{what} failed: {bad[0].get('message')}")

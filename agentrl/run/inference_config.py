"""InferenceConfig: a run's ``inference`` section — the servers it starts or uses, and its client.

What it is: the typed settings of what the launchers start (``agentrl serve``, SGLang or vLLM
servers, SGLang's router: ``agentrl.run.local_launcher``, ``agentrl.run.router``) and of the
client every part of the run reaches them with (``inference.client``: the client package's
``RemoteEngineConfig``), ``apply_auto_engine``, which turns ``engine: auto`` into an engine by the
model's size (``auto_engine``, the rule, pure), and ``check_engine``, the refusals by key of an engine
that is not installed or cannot take what the trainer sends (a merged adapter, a broadcast adapter).
It sits in the run package because it joins two components that never import each other
(the server's ``agentrl.inference`` and the client's ``agentrl.client``).
What it is not: ``agentrl serve``'s own settings (``agentrl.inference.serve_config``) or the client.
"""

from __future__ import annotations

import importlib.util
import warnings
from dataclasses import dataclass, replace
from typing import Any

from agentrl.client.engines import ENGINES
from agentrl.client.remote_engine import RemoteEngineConfig
from agentrl.config import option
from agentrl.errors import ConfigError

ROUTERS = ("client", "sglang")
AUTO_ENGINE = "auto"


@dataclass
class InferenceConfig:
    """Where generation happens."""

    servers: list[str] = option([], help="URLs of running servers (SGLang, vLLM or agentrl serve); empty: start "
                                         "our own")
    engine: str = option("agentrl", choices=(*ENGINES, AUTO_ENGINE),
                         help="what to start when servers is empty: agentrl serve (CPU or GPU), "
                              "python -m sglang.launch_server (needs the sglang extra and a GPU), or vLLM's "
                              "OpenAI server (`make vllm` installs it in .venv-vllm; or inference.vllm_python); "
                              "auto: by the model's size (inference.auto_vllm_parameters), decided at start")
    auto_vllm_parameters: int | None = option(
        None, ge=1, help="engine auto on a CPU: a model of at least this many parameters starts vLLM (when "
                         "installed and the run's weight sync allows it), a smaller one agentrl serve; null: "
                         "agentrl serve at every size (benchmarks/sizes.py measures where the engines cross)")
    num_servers: int = option(1, ge=1, help="servers to start")
    threads: int = option(1, ge=1, help="agentrl serve and vLLM on CPU: torch threads of each server")
    max_running_requests: int = option(256, ge=1, help="agentrl serve and vLLM: requests decoded together")
    extra_args: list[str] = option([], help="more command-line arguments for each started server")
    request_timeout_s: float | None = option(None, gt=0, help="deprecated: use inference.client.timeout")
    startup_timeout_s: float = option(300.0, gt=0, help="seconds a started server may take to be ready")
    restart_failed: bool = option(True, help="restart a started server that dies (the client re-syncs its weights)")
    router: str = option("client", choices=ROUTERS,
                         help="client: RemoteEngine sends each call to the server with the fewest in flight; "
                              "sglang: start SGLang's router (pip install sglang-router) in front of the servers "
                              "and generate through it (weight updates still go to every server)")
    router_args: list[str] = option([], help="more arguments for the router, e.g. [--policy, power_of_two]")
    vllm_python: str | None = option(None, help="engine vllm: the Python that has vLLM; default .venv-vllm/bin/python "
                                                "of the current directory or of this checkout, else this Python")
    vllm_kv_cache_gib: float = option(1.0, gt=0, help="engine vllm on CPU: GiB of KV cache per server "
                                                      "(VLLM_CPU_KVCACHE_SPACE)")
    release_memory: bool | None = option(None,
                                 help="placement colocated: while the trainer trains, the servers free their KV "
                                      "cache (and weight memory where they can) and take it back for the weight "
                                      "update and generation (SGLang: /release_memory_occupation, started with "
                                      "--enable-memory-saver; vLLM: /sleep and /wake_up; agentrl serve: the slot "
                                      "cache, the prefix pool and the spare weight copies); null: when the "
                                      "servers share the trainer's GPU")
    client: RemoteEngineConfig = option(RemoteEngineConfig, help="how the trainer and the rollouts reach the servers")

    def __post_init__(self) -> None:
        if self.request_timeout_s is not None:
            warnings.warn("config key 'inference.request_timeout_s' is deprecated and will be removed; use "
                          "inference.client.timeout", FutureWarning, stacklevel=2)
            self.client, self.request_timeout_s = replace(self.client, timeout=self.request_timeout_s), None
        if self.engine == "vllm" and self.client.engine == "auto":
            self.client = replace(self.client, engine="vllm")

    @property
    def served_by(self) -> str:
        """The engine that answers: ``vllm`` when either side says so, else ``engine``."""
        return "vllm" if "vllm" in (self.engine, self.client.engine) else self.engine


def auto_engine(parameters: int, *, device: str, vllm_above: int | None, vllm_usable: str | None) -> tuple[str, str]:
    """``engine: auto``'s choice and why: vLLM for a model of at least ``vllm_above`` parameters on a
    CPU, unless ``vllm_usable`` says why it cannot serve this run; agentrl serve otherwise."""
    size = f"{parameters / 1e6:,.1f} M parameters"
    if device != "cpu":
        return "agentrl", f"agentrl serve ({device}: the size rule is measured on CPUs only)"
    if vllm_above is None or parameters < vllm_above:
        limit = "no vLLM size is set" if vllm_above is None else f"below inference.auto_vllm_parameters={vllm_above:,}"
        return "agentrl", f"agentrl serve ({size}, {limit})"
    if vllm_usable is not None:
        return "agentrl", f"agentrl serve ({size}, but {vllm_usable})"
    return "vllm", f"vllm ({size}, at least inference.auto_vllm_parameters={vllm_above:,})"


def apply_auto_engine(cfg: Any) -> str | None:
    """``inference.engine: auto`` (``cfg``: a ``RunConfig`` whose model directory was checked) made the
    engine ``auto_engine`` picks, counting the model's parameters from its safetensors headers; a line
    to print, or None when the engine was named."""
    inference = cfg.inference
    if inference.engine != AUTO_ENGINE:
        return None
    from math import prod

    from agentrl.client.checkpoint_check import read_headers

    parameters = sum(prod(shape) for _, _, shape, _, _ in read_headers(cfg.model).values())
    engine, why = auto_engine(parameters, device=cfg.device, vllm_above=inference.auto_vllm_parameters,
                              vllm_usable=vllm_refusal(cfg))
    cfg.inference = replace(inference, engine=engine)
    return f"inference.engine auto: {why}"


def vllm_refusal(cfg: Any) -> str | None:
    """Why a started vLLM could not serve this run, or None."""
    from agentrl.run.local_launcher import vllm_python

    sync = cfg.trainer.weight_sync
    if inference_servers := cfg.inference.servers:
        return f"inference.servers lists {len(inference_servers)} running server(s)"
    if cfg.deterministic:
        return "deterministic mode needs agentrl serve"
    if cfg.trainer.lora.enabled and (sync.adapters == "merge" or sync.transport == "distributed"):
        return "vLLM cannot take this run's LoRA weight sync"
    if vllm_python(cfg) is None:
        return "vLLM is not installed (make vllm)"
    return None


def check_engine(cfg: Any) -> None:
    """The run's engine (``cfg``: a ``RunConfig``) is installed where it is started, and takes the
    trainer's adapters the way ``trainer.weight_sync`` sends them."""
    inference = cfg.inference
    if inference.engine == "sglang" and not inference.servers and importlib.util.find_spec("sglang") is None:
        raise ConfigError("config key 'inference.engine': sglang is not installed "
                          "(pip install 'agentrl[sglang]' on a GPU machine), or give inference.servers")
    other = inference.served_by
    sync = cfg.trainer.weight_sync
    if cfg.trainer.lora.enabled and sync.adapters == "merge" and other != "agentrl":
        raise ConfigError(f"config key 'trainer.weight_sync.adapters': merge needs agentrl serve ({other} cannot merge "
                          f"an adapter into its weights); use load or auto with inference.engine: {other}")
    if cfg.trainer.lora.enabled and sync.transport == "distributed" and other != "agentrl":
        raise ConfigError(f"config key 'trainer.weight_sync.transport': a LoRA run's adapter is broadcast to agentrl "
                          f"serve only ({other} loads adapters from disk); use transport: disk with inference.engine: "
                          f"{other}")
    if inference.engine == "vllm" and not inference.servers:
        check_vllm(cfg)


def check_vllm(cfg: Any) -> None:
    """A run that starts vLLM servers has a Python with vLLM."""
    from agentrl.run.local_launcher import vllm_python

    if vllm_python(cfg) is None:
        raise ConfigError("config key 'inference.engine': vllm is not installed here; run `make vllm` (vLLM in "
                          ".venv-vllm), set inference.vllm_python to a Python that has it, or list running vLLM "
                          "servers in inference.servers")

"""RunConfig: one YAML file for a whole training run (``agentrl train CONFIG [key=value ...]``).

What it is: the sections of a run as typed, documented dataclasses — ``inference`` (servers
to start or to use), ``rollout`` (data, workflow, groups, concurrency, sampling), ``trainer``
(``agentrl.trainer.TrainerConfig``, η included), ``eval``, ``checkpoint``, ``logging``,
``sandbox`` — and ``check_run_config``, which refuses what cannot exist (a missing model
directory, an unknown env id or workflow, more GPUs than present) before anything starts,
in one line naming the key. ``agentrl train --help-config`` prints every key with its help.
What it is not: the launcher (``agentrl.run.local_launcher``) or the loop (``agentrl.run.loop``).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agentrl.api import SamplingParams
from agentrl.client.remote_engine import RemoteEngineConfig
from agentrl.config import option
from agentrl.errors import ConfigError
from agentrl.inference.serve_config import reasoning_parser_option, tool_call_parser_option
from agentrl.rollout.gateway_config import GatewayConfig
from agentrl.rollout.lockstep import LockstepConfig, chunkable
from agentrl.rollout.record import RECORD_MAX_BYTES
from agentrl.rollout.recorded import SOURCES
from agentrl.trainer.trainer_config import TrainerConfig

ROUTERS = ("client", "sglang")
ENGINES = ("agentrl", "sglang", "vllm")
LAUNCHERS = ("local", "ray")
PLACEMENTS = ("auto", "colocated", "decoupled")


@dataclass
class InferenceConfig:
    """Where generation happens."""

    servers: list[str] = option([], help="URLs of running servers (SGLang, vLLM or agentrl serve); empty: start "
                                         "our own")
    engine: str = option("agentrl", choices=ENGINES,
                         help="what to start when servers is empty: agentrl serve (CPU or GPU), "
                              "python -m sglang.launch_server (needs the sglang extra and a GPU), or vLLM's "
                              "OpenAI server (`make vllm` installs it in .venv-vllm; or inference.vllm_python)")
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


@dataclass
class RolloutConfig:
    """What is played, and how far generation may run ahead of training."""

    source: str = option("workflow",
                         help="workflow: the executor plays rows of the dataset with the workflow; gateway: "
                              "agents play on their own through the run's OpenAI-compatible gateway; a path "
                              "(RUN_DIR/record of a run, or agentrl replay's output): train off-policy on its "
                              "recorded steps, step k on recorded step k, nothing generated")
    workflow: str = option("workflows.env:EnvWorkflow", help="import path of the Workflow class")
    workflow_args: dict[str, Any] = option({}, help="keyword arguments of the workflow (env_id, env kwargs, ...)")
    dataset: str = option("", help="rows to play: a .jsonl file, or the import path of a function (seed) -> "
                                   "list of rows (required)")
    shuffle: bool = option(True, help="visit the rows in a seeded random order, reshuffled every epoch")
    group_size: int = option(8, ge=1, help="n: episodes per prompt, one GRPO group")
    batch_size: int = option(16, ge=1, help="B: groups per train step")
    max_concurrent: int = option(256, ge=1, help="episodes in flight at once (whole groups)")
    filter_equal_rewards: bool = option(False, help="drop groups whose rewards are all equal and admit "
                                                    "another prompt (DAPO's dynamic sampling); counted")
    episode_timeout_s: float | None = option(None, gt=0, help="deprecated: use rollout.workflow_args.timeout_s (the "
                                                               "workflow's own episode budget)")
    max_failed_fraction: float = option(0.9, gt=0, le=1, help="agentrl train (and agentrl eval) exits with code 1 "
                                                              "when this share of the episodes or more failed (saying "
                                                              "the first error)")
    tool_call_parser: str = tool_call_parser_option("for the env's tools and the workflow (when it takes "
                                                    "tool_call_parser)")
    reasoning_parser: str | None = reasoning_parser_option("a tool call written in it is never run")
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(max_new_tokens=256),
                                     metadata={"help": "sampling during rollouts (a seed here gives each call of each "
                                                       "episode its own seed: agentrl.rollout.seeds)"})
    lockstep: LockstepConfig = option(LockstepConfig, help="deterministic mode's generation rounds "
                                                           "(agentrl.rollout.lockstep)")
    worker: str = option("auto", choices=("auto", "process", "thread"),
                         help="where the episodes run: process: a child process of rank 0 with its own inference "
                              "client (the episodes' Python and the trainer's do not share an interpreter lock); "
                              "thread: rank 0's event loop, beside the trainer's thread. auto: process, except with "
                              "deterministic, rollout.source gateway or recorded steps (thread); the run's second "
                              "line says which and why")

    @property
    def recorded(self) -> str | None:
        """The path of the recorded steps this run trains on, or None (it plays or serves)."""
        return None if self.source in SOURCES else self.source

    def __post_init__(self) -> None:
        if self.episode_timeout_s is not None:  # one episode budget: the workflow's own timeout_s
            warnings.warn("config key 'rollout.episode_timeout_s' is deprecated and will be removed; use "
                          "rollout.workflow_args.timeout_s", FutureWarning, stacklevel=2)
            self.workflow_args = {"timeout_s": self.episode_timeout_s, **self.workflow_args}
            self.episode_timeout_s = None


EVAL_SCORE = re.compile(r"pass@\d+(_ci95)?|problems|failed_episodes|(episodes|successes)/reward/\S+")
"""The keys of ``EvalReport.summary()``: what ``eval.figures`` may name."""


def figure_scores(figure: str) -> list[str]:
    """The scores an ``eval.figures`` value names: ``[SCORE]``, or ``[A, B]`` for ``A / B``."""
    return [part.strip() for part in figure.split(" / ")]


def figure_value(figure: str, scores: dict[str, float]) -> float | None:
    """An ``eval.figures`` value read from an evaluation's scores: a score, or the ratio ``A / B``
    (e.g. the share of first-wrong episodes fixed: ``episodes/reward/fixed / episodes/reward/first_wrong``);
    None when a score is absent (no episode reported it) or the divisor is 0."""
    parts = [scores.get(part) for part in figure_scores(figure)]
    if any(v is None for v in parts):
        return None
    if len(parts) == 1:
        return parts[0]
    return parts[0] / parts[1] if parts[1] else None


@dataclass
class EvalConfig:
    """Held-out evaluation (greedy by default) before training, every N steps, and at the end."""

    dataset: str | None = option(None, help="rows to evaluate on (like rollout.dataset); none: no evaluation")
    limit: int | None = option(None, ge=1, help="evaluate on the first N rows only")
    every_steps: int = option(0, ge=0, help="evaluate every N steps too (0: only before and after)")
    k: int = option(1, ge=1, help="samples per problem (pass@k for every k' <= k is reported)")
    workflow_args: dict[str, Any] = option({}, help="workflow arguments that differ for evaluation")
    figures: dict[str, str] = option({}, help="summary keys read from the evaluation's scores: NAME: SCORE puts "
                                             "SCORE of the first evaluation in NAME_before and of the last in NAME_after "
                                             "(as eval_before and eval_after), "
                                             "e.g. {tool_use_rate: successes/reward/used_tool_result}; SCORE / SCORE "
                                             "is their ratio, e.g. {fixed: episodes/reward/fixed / "
                                             "episodes/reward/first_wrong}")
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(max_new_tokens=256, temperature=0.0),
                                     metadata={"help": "sampling for evaluation (greedy by default)"})

    def __post_init__(self) -> None:
        for name, score in self.figures.items():  # a misspelt score would read None at every evaluation
            parts = figure_scores(str(score))
            if len(parts) > 2 or not all(EVAL_SCORE.fullmatch(part) for part in parts):
                raise ConfigError(f"config key 'eval.figures.{name}': got {score!r}, expected an evaluation score: "
                                  "pass@K, pass@K_ci95, problems, failed_episodes, episodes/reward/NAME or "
                                  "successes/reward/NAME (NAME: a reward term of the env), or two of them as "
                                  "SCORE / SCORE")


@dataclass
class CheckpointConfig:
    every_steps: int = option(10, ge=0, help="save a resumable checkpoint every N steps (0: only at the end)")
    keep_last: int = option(2, ge=1, help="checkpoints kept on disk")


@dataclass
class LoggingConfig:
    tensorboard: bool = option(True, help="write TensorBoard event files to RUN_DIR/tensorboard")
    wandb_project: str | None = option(None, help="also log to this Weights & Biases project (needs wandb)")
    trajectories_per_step: int = option(16, ge=0, help="trajectories of each step kept in RUN_DIR/trajectories")
    record: bool = option(True, help="write every trajectory of every step whole (tokens, behaviour logprobs, "
                                     "versions, reward, status; the episode's environment record on its first) "
                                     "to RUN_DIR/record/step_NNNNNN.jsonl: what agentrl replay re-scores and "
                                     "rollout.source=RUN_DIR/record trains on")
    record_max_bytes: int = option(RECORD_MAX_BYTES, ge=0,
                                   help="bound of one episode's environment record (observations, actions, "
                                        "rewards and their terms, facts, seeds) in bytes of JSON; what does not fit "
                                        "is cut and marked (record.truncated, cut_events), never dropped silently")
    progress: bool = option(True, help="a live progress line on the terminal")


@dataclass
class SandboxConfig:
    backend: str = option("", help="sandbox of code envs: local, docker, a service URL; empty: the env's default")
    services: list[str] = option([], help="URLs of sandbox services (agentrl sandbox serve); programs are spread "
                                          "over them (the least busy first); replaces backend when given")

    def spec(self) -> str:
        """What code envs get as their ``sandbox`` argument ("" when the env's default applies);
        several services are one comma-separated spec (``agentrl.plugins.make_sandbox``)."""
        return ",".join(self.services) if self.services else self.backend


@dataclass
class RayConfig:
    """``launcher: ray``: where and how the run's processes are placed on a Ray cluster."""

    address: str = option("auto", help="the cluster to join: auto (RAY_ADDRESS, else the one `ray start --head` "
                                       "started on this machine) or ray://HOST:PORT / HOST:PORT")
    placement_strategy: str = option("PACK", choices=("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"),
                                     help="how the trainer ranks' placement group spreads over nodes")


@dataclass
class RunConfig:
    """A training run: ``agentrl train CONFIG [key=value ...]``."""

    model: str = option(help="HF checkpoint directory of the initial policy (config.json, weights, tokenizer)")
    run_dir: str = option("runs/run", help="where everything of the run goes (config, metrics, checkpoints)")
    steps: int = option(100, ge=1, help="train steps (policy versions) to run")
    max_minutes: float | None = option(None, gt=0, help="stop (and save) after this much wall time")
    seed: int = option(0, help="seed of the data order (the trainer's RNGs have trainer.seed)")
    world_size: int = option(1, ge=1, help="trainer ranks in all (processes under torchrun, split evenly over nnodes)")
    nnodes: int = option(1, ge=1, help="nodes the trainer ranks span (torchrun --nnodes); run `agentrl train` "
                                       "once per node, run_dir on a filesystem all of them share")
    node_rank: int = option(0, ge=0, help="this node (torchrun --node-rank); node 0 starts the inference servers "
                                          "and holds rank 0")
    master_addr: str = option("127.0.0.1", help="an address of node 0 every node reaches (torchrun --master-addr)")
    master_port: int | None = option(None, ge=1, le=65535, help="rendezvous port on node 0 (torchrun "
                                                                "--master-port); required with nnodes > 1; "
                                                                "null: a free port")
    launcher: str = option("local", choices=LAUNCHERS, help="local: processes on this machine (torchrun); ray: "
                                                            "actors on a running Ray cluster (pip install "
                                                            "'agentrl[ray]')")
    device: str = option("cpu", choices=("cpu", "cuda"), help="where the trainer ranks run")
    placement: str = option(
        "auto", choices=PLACEMENTS,
        help="colocated: generation and training take turns on the same cores (or GPU), each with all of them "
             "(threads and inference.threads become the cores per rank and per server; generation pauses for "
             "each train step, in-flight requests resume after it); decoupled: both at once, each on its own "
             "threads or devices. auto: colocated when the started servers would share the trainer's GPU, "
             "decoupled otherwise (on a CPU it measured faster: benchmarks/vs_trl.py, the demo); the run's first "
             "line says which and why")
    threads: int = option(1, ge=1, help="torch threads of each trainer rank")
    deterministic: bool = option(
        False, help="two runs of the same config give the same metrics and weights, η > 0 included: generation "
                    "in rounds (rollout.lockstep), batches in row order, weights published between fixed rounds, "
                    "agentrl serve batch-invariant, sampling seeded (rollout.sampling.seed defaults to seed). "
                    "agentrl serve only; slower (DESIGN.md §4 'Deterministic mode')")
    inference: InferenceConfig = option(InferenceConfig, help="inference servers")
    rollout: RolloutConfig = option(RolloutConfig, help="rollouts")
    trainer: TrainerConfig = option(TrainerConfig, help="the trainer (η is trainer.max_staleness)")
    eval: EvalConfig = option(EvalConfig, help="evaluation")
    checkpoint: CheckpointConfig = option(CheckpointConfig, help="checkpoints")
    logging: LoggingConfig = option(LoggingConfig, help="metrics and samples")
    sandbox: SandboxConfig = option(SandboxConfig, help="sandboxes")
    ray: RayConfig = option(RayConfig, help="launcher: ray")
    gateway: GatewayConfig = option(GatewayConfig(port=0, default_max_tokens=None), help="the gateway (rollout.source: gateway), on a free "
                                                                "port by default")


DATA_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet")


def dataset_file(spec: str) -> Path | None:
    """The file a dataset spec names — a path, or the name of a file shipped in ``data/`` —
    or None when the spec is an import path (``module:function``)."""
    if not spec.endswith(DATA_SUFFIXES):
        return None
    if Path(spec).is_file():
        return Path(spec)
    from agentrl.env.datasets import data_path

    return data_path(spec)  # raises ConfigError naming what data/ holds


def build_workflow(cfg: Any, sampling: Any, overrides: dict[str, Any] | None = None) -> Any:
    """The configured workflow, given the model's tokenizer and ``sampling`` (when it takes them)."""
    import inspect

    from agentrl.plugins import load_object

    cls = load_object(cfg.rollout.workflow)
    kwargs = {**cfg.rollout.workflow_args, **(overrides or {})}
    params = inspect.signature(cls).parameters
    if "tokenizer" in params and "tokenizer" not in kwargs:
        kwargs["tokenizer"] = cfg.model
    if "sampling" in params and "sampling" not in kwargs:
        kwargs["sampling"] = sampling
    for key in ("tool_call_parser", "reasoning_parser"):
        if key in params and key not in kwargs:
            kwargs[key] = getattr(cfg.rollout, key)
    if cfg.sandbox.spec() and "env_kwargs" in params:
        kwargs["env_kwargs"] = {"sandbox": cfg.sandbox.spec(), **(kwargs.get("env_kwargs") or {})}
    check_workflow_args(cls, cfg.rollout.workflow, kwargs, "rollout.workflow_args")
    return cls(**kwargs)


def check_workflow_args(cls: Any, name: str, args: dict[str, Any], key: str) -> None:
    """Refuse arguments the workflow ``cls`` does not take, naming the config key."""
    import inspect

    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # no signature to read: the call itself will say
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(args) - set(params))
    if unknown:
        raise ConfigError(f"config key '{key}': {name} takes no argument {unknown} (its arguments: "
                          f"{[k for k in params if k != 'self']}); an episode's time budget is the workflow's own "
                          "timeout_s")


def dataset_rows(spec: str, seed: int) -> list[dict[str, Any]]:
    """The rows of ``rollout.dataset``/``eval.dataset``: a data file (a path, or a file shipped in
    ``data/``), or ``module:function(seed)``."""
    from agentrl.plugins import load_object

    path = dataset_file(spec)
    if path is not None:
        from agentrl.env.datasets import load_rows as read

        return list(read(path))
    rows = load_object(spec)(seed)
    rows = list(rows)
    if not all(isinstance(r, dict) for r in rows):
        raise ConfigError(f"dataset {spec!r} must give dicts (one row per episode)")
    return rows


def check_run_config(cfg: RunConfig) -> None:
    """Refuse, before anything starts, what cannot work; each error names its config key."""
    from agentrl.plugins import load_object

    model = Path(cfg.model)
    if not (model / "config.json").is_file():
        raise ConfigError(f"config key 'model': {cfg.model!r} is not a model directory (no config.json); "
                          "build the demo one with `agentrl model tiny --out DIR`")
    check_context(cfg, model)
    if cfg.rollout.worker == "process" and (here := rollout_stays_in_rank_0(cfg)):
        raise ConfigError(f"config key 'rollout.worker': process cannot run with {here}; use thread (or auto)")
    if cfg.rollout.source == "gateway":
        import ipaddress
        import os

        host = cfg.gateway.host
        loopback = host == "localhost" or (host.replace(".", "").isdigit() and ipaddress.ip_address(host).is_loopback)
        if not loopback and not os.environ.get(cfg.gateway.api_key_env):
            raise ConfigError(f"config key 'gateway.host': {host!r} is not a loopback address and "
                              f"${cfg.gateway.api_key_env} holds no API key; set one, or serve on 127.0.0.1")
    elif cfg.rollout.recorded is not None:
        check_recorded(cfg)
    elif not cfg.rollout.dataset:
        raise ConfigError("config key 'rollout.dataset' is required: a .jsonl file or 'module:function' "
                          "giving the rows to play (e.g. envs.arith:training_rows)")
    try:
        workflow = load_object(cfg.rollout.workflow)
    except ConfigError as e:
        raise ConfigError(f"config key 'rollout.workflow': {e}") from e
    for key, args in (("rollout.workflow_args", cfg.rollout.workflow_args), ("eval.workflow_args", cfg.eval.workflow_args)):
        check_workflow_args(workflow, cfg.rollout.workflow, args, key)
    # the datasets first: a module that provides rows may also register its environment
    for key, spec in (("rollout.dataset", cfg.rollout.dataset), ("eval.dataset", cfg.eval.dataset)):
        if not spec:
            continue
        try:
            if dataset_file(spec) is None:
                load_object(spec)
        except ConfigError as e:
            raise ConfigError(f"config key {key!r}: {e}") from e
    env_id = cfg.rollout.workflow_args.get("env_id")
    if env_id is not None:
        from agentrl.plugins import find_env

        try:
            env_id = find_env(env_id)
        except ConfigError as e:
            raise ConfigError(f"config key 'rollout.workflow_args.env_id': {e}") from e
        if cfg.sandbox.spec() and not takes_sandbox(env_id):
            key = "sandbox.services" if cfg.sandbox.services else "sandbox.backend"
            raise ConfigError(f"config key {key!r}: the environment {env_id!r} takes no sandbox argument; "
                              "leave the sandbox keys empty for it (they are for code environments)")
    for url in cfg.sandbox.services:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"config key 'sandbox.services': {url!r} is not a URL of a sandbox service "
                              "(http://HOST:PORT, as `agentrl sandbox serve` prints it)")
    check_placement(cfg)
    if cfg.launcher == "local" and (cfg.device == "cuda" or cfg.inference.engine == "sglang"):
        import torch

        have = torch.cuda.device_count()
        need = cfg.world_size // cfg.nnodes if cfg.device == "cuda" else 0
        if cfg.inference.engine == "sglang" and not cfg.inference.servers and cfg.node_rank == 0:
            need += cfg.inference.num_servers
        if need > have:
            raise ConfigError(f"config keys 'device'/'world_size'/'inference': the run needs {need} GPUs, "
                              f"this machine has {have}")
        from agentrl.run.local_launcher import server_has_own_gpu

        sync = cfg.trainer.weight_sync
        nccl = sync.backend_for(cfg.device) == "nccl"
        if (sync.transport == "distributed" and nccl and cfg.inference.engine in ("agentrl", "vllm")
                and not cfg.inference.servers and not server_has_own_gpu(cfg, cfg.inference.num_servers - 1, have)):
            raise ConfigError(
                "config key 'trainer.weight_sync.transport': distributed weights go over NCCL, which cannot join "
                f"two processes on one GPU, and this machine's {have} GPU(s) leave the inference servers none of "
                f"their own (they share the trainer's: world_size {cfg.world_size // cfg.nnodes} + num_servers "
                f"{cfg.inference.num_servers} > {have}); use transport: disk here, or a machine with a GPU per "
                "server beside the trainer's")
    if cfg.inference.engine == "sglang" and not cfg.inference.servers:
        import importlib.util

        if importlib.util.find_spec("sglang") is None:
            raise ConfigError("config key 'inference.engine': sglang is not installed "
                              "(pip install 'agentrl[sglang]' on a GPU machine), or give inference.servers")
    other = "vllm" if "vllm" in (cfg.inference.engine, cfg.inference.client.engine) else cfg.inference.engine
    if cfg.trainer.lora.enabled and cfg.trainer.weight_sync.adapters == "merge" and other != "agentrl":
        raise ConfigError(f"config key 'trainer.weight_sync.adapters': merge needs agentrl serve ({other} cannot merge "
                          f"an adapter into its weights); use load or auto with inference.engine: {other}")
    if cfg.trainer.lora.enabled and cfg.trainer.weight_sync.transport == "distributed" and other != "agentrl":
        raise ConfigError(f"config key 'trainer.weight_sync.transport': a LoRA run's adapter is broadcast to agentrl "
                          f"serve only ({other} loads adapters from disk); use transport: disk with inference.engine: "
                          f"{other}")
    if cfg.inference.client.engine == "vllm" or cfg.inference.engine == "vllm":
        check_vllm(cfg)
    if cfg.deterministic:
        check_deterministic(cfg)
    if ":" in cfg.trainer.loss.kind:  # the user's objective: imported now, not once the servers are up
        from agentrl.trainer.objective import resolve_objective

        resolve_objective(cfg.trainer.loss.kind)
    if cfg.rollout.group_size < 2:  # every advantage is group-relative (trainer.advantages: GRPO, then batch norm)
        raise ConfigError(f"config key 'rollout.group_size': {cfg.rollout.group_size} episode per prompt gives "
                          "every advantage 0 (reward minus its group's mean), so the run would learn nothing; "
                          "use 2 or more (8 to 16 is usual)")
    if cfg.rollout.max_concurrent < cfg.rollout.group_size:
        raise ConfigError(f"config key 'rollout.max_concurrent': {cfg.rollout.max_concurrent} cannot hold one "
                          f"group of rollout.group_size={cfg.rollout.group_size} episodes")


def check_recorded(cfg: RunConfig) -> None:
    """``rollout.source`` a path: recorded steps that this run's batches can be, one for one."""
    from agentrl.rollout.recorded import RecordedEpisodes

    try:
        recorded = RecordedEpisodes(cfg.rollout.recorded)
    except ConfigError as e:
        raise ConfigError(f"config key 'rollout.source': {cfg.rollout.source!r} is not workflow or gateway, and "
                          f"as a path: {e}") from None
    if Path(cfg.run_dir).resolve() in {p.resolve() for p in (recorded.path, recorded.steps[0].parent.parent)}:
        raise ConfigError("config key 'run_dir': it is the run whose record rollout.source names; train into "
                          "another directory")
    if cfg.rollout.filter_equal_rewards:
        raise ConfigError("config key 'rollout.filter_equal_rewards': a recorded run's groups were filtered when it "
                          "ran; dropping more would shift its steps against this run's; leave it false")
    recorded.check(batch_size=cfg.rollout.batch_size, steps=cfg.steps)


def check_context(cfg: RunConfig, model: Path) -> None:
    """A token budget that leaves no room for a prompt in the model's context fails every
    episode (the server refuses prompt + max_new_tokens beyond it): refuse it here, by key."""
    import json

    try:
        context = json.loads((model / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return  # the model's own loader says what is wrong with it
    if not isinstance(context, int):
        return
    for key, sampling in (("rollout.sampling", cfg.rollout.sampling), ("eval.sampling", cfg.eval.sampling)):
        if sampling.max_new_tokens >= context:
            raise ConfigError(f"config key '{key}.max_new_tokens': {sampling.max_new_tokens} tokens leave no room for "
                              f"a prompt in the model's context of {context} tokens (max_position_embeddings); "
                              f"every episode would fail. Use at most {context // 2} or so")


def check_deterministic(cfg: RunConfig) -> None:
    """What ``deterministic: true`` can hold to: agentrl serve, generation it cuts into chunks."""
    if cfg.inference.engine != "agentrl" or cfg.inference.client.engine == "vllm":
        raise ConfigError("config key 'deterministic': it needs agentrl serve's batch-invariant decoding "
                          "(inference.engine: agentrl); vLLM and SGLang are not batch-invariant by default, so "
                          "the same requests may sample other tokens from run to run")
    if cfg.rollout.source == "gateway":
        raise ConfigError("config key 'deterministic': with rollout.source gateway, outside agents decide when "
                          "they call; only the run's own workflow can be held to rounds")
    if cfg.placement == "colocated":
        raise ConfigError("config key 'placement': deterministic mode overlaps generation and training by "
                          "rollout.lockstep.overlap_rounds; use placement decoupled (or auto)")
    why = chunkable(cfg.rollout.sampling)
    if why is not None:
        raise ConfigError(f"config key 'rollout.sampling': deterministic mode cuts generation into chunks of "
                          f"rollout.lockstep.chunk_tokens and cannot honour {why}")


def apply_deterministic(cfg: RunConfig) -> str | None:
    """Deterministic mode's defaults: the servers started batch-invariant, the sampling seeded
    from the run's ``seed``; returns the line the run prints, or None when the mode is off."""
    if not cfg.deterministic:
        return None
    flag = "--enable-deterministic-inference"
    if not cfg.inference.servers and flag not in cfg.inference.extra_args:
        cfg.inference.extra_args = [*cfg.inference.extra_args, flag]
    for sampling in (cfg.rollout.sampling, cfg.eval.sampling):
        if sampling.seed is None:
            sampling.seed = cfg.seed
    return (f"deterministic: generation in rounds of {cfg.rollout.lockstep.chunk_tokens} tokens, "
            f"{cfg.rollout.lockstep.overlap_rounds} of them overlapping each train step; sampling seed "
            f"{cfg.rollout.sampling.seed}")


def check_vllm(cfg: RunConfig) -> None:
    """What a run on vLLM servers needs (``inference.engine: vllm`` or ``inference.client.engine: vllm``)."""
    if cfg.inference.engine != "vllm" or cfg.inference.servers:
        return
    from agentrl.run.local_launcher import vllm_python

    if vllm_python(cfg) is None:
        raise ConfigError("config key 'inference.engine': vllm is not installed here; run `make vllm` (vLLM in "
                          ".venv-vllm), set inference.vllm_python to a Python that has it, or list running vLLM "
                          "servers in inference.servers")


def usable_cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def choose_placement(cfg: RunConfig) -> tuple[str, str]:
    """(``colocated`` or ``decoupled``, why) for this run on this machine."""
    if cfg.placement != "auto":
        return cfg.placement, "placement set"
    elsewhere = ("deterministic mode (rounds overlap the train step)" if cfg.deterministic
                 else "launcher ray" if cfg.launcher == "ray" else f"{cfg.nnodes} nodes" if cfg.nnodes > 1
                 else "rollout.source gateway (agents call at any time)" if cfg.rollout.source == "gateway"
                 else "inference.servers run elsewhere" if cfg.inference.servers else "")
    if elsewhere:
        return "decoupled", elsewhere
    if cfg.device == "cuda":
        import torch

        from agentrl.run.local_launcher import server_has_own_gpu

        gpus = torch.cuda.device_count()
        if server_has_own_gpu(cfg, 0, gpus):
            return "decoupled", f"the servers have GPUs of their own ({gpus} GPUs)"
        return "colocated", f"the servers share the trainer's GPU ({gpus} GPU{'s' if gpus != 1 else ''})"
    return "decoupled", "a CPU: generation and training each keep their own threads"


def apply_placement(cfg: RunConfig) -> str:
    """Resolve ``cfg.placement`` (and, colocated on a CPU, give each phase every core: ``threads``
    per trainer rank and ``inference.threads`` per started server); returns the run's first line."""
    placement, why = choose_placement(cfg)
    cfg.placement = placement
    release = cfg.inference.release_memory
    if placement == "decoupled":
        if release:
            raise ConfigError(f"config key 'inference.release_memory': true frees the servers' memory while the "
                              f"trainer trains, which needs placement colocated (this run is decoupled: {why})")
        cfg.inference.release_memory = False
        return f"placement decoupled ({why}): generation and training run at the same time"
    if release is None:
        cfg.inference.release_memory = cfg.device == "cuda"
    line = f"placement colocated ({why}): generation and training take turns"
    if cfg.device == "cpu":
        cores = usable_cores()
        cfg.threads = max(1, cores // cfg.world_size)
        if not cfg.inference.servers:
            cfg.inference.threads = max(1, cores // cfg.inference.num_servers)
        line += f", each with all {cores} cores (threads={cfg.threads}, inference.threads={cfg.inference.threads})"
    if cfg.inference.release_memory:
        line += ", the servers' memory released while the trainer trains"
    return line


def rollout_stays_in_rank_0(cfg: RunConfig) -> str:
    """Why this run's episodes must run in rank 0's event loop ("" if they need not)."""
    return ("deterministic mode (the lockstep clock paces both)" if cfg.deterministic
            else "rollout.source gateway (the gateway's agents feed the executor)" if cfg.rollout.source == "gateway"
            else "recorded steps (nothing is generated)" if cfg.rollout.recorded is not None else "")


def apply_rollout_worker(cfg: RunConfig) -> str:
    """Resolve ``cfg.rollout.worker`` (``process`` or ``thread``); returns the line that says which and why."""
    here = rollout_stays_in_rank_0(cfg)
    if cfg.rollout.worker == "auto":
        cfg.rollout.worker, why = ("thread", here) if here else (
            "process", "the episodes' Python does not wait on the trainer's interpreter lock")
    else:
        why = "rollout.worker set"
    where = "a process of their own" if cfg.rollout.worker == "process" else "rank 0's event loop"
    return f"rollout.worker {cfg.rollout.worker} ({why}): episodes run in {where}"


def check_placement(cfg: RunConfig) -> None:
    """The keys that say where processes go: nodes, launcher, router."""
    import importlib.util

    if cfg.world_size % cfg.nnodes:
        raise ConfigError(f"config key 'world_size': {cfg.world_size} ranks cannot be split evenly over "
                          f"nnodes={cfg.nnodes} (torchrun runs the same number of ranks on every node)")
    if cfg.node_rank >= cfg.nnodes:
        raise ConfigError(f"config key 'node_rank': {cfg.node_rank} is not below nnodes={cfg.nnodes}")
    if cfg.nnodes > 1 and cfg.master_port is None:
        raise ConfigError("config key 'master_port': nnodes > 1 needs a fixed rendezvous port that every node "
                          "is given (and master_addr, an address of node 0 they all reach)")
    if cfg.launcher == "ray":
        if cfg.nnodes > 1:
            raise ConfigError("config key 'nnodes': with launcher=ray, Ray places the ranks; leave nnodes at 1 "
                              "and run `agentrl train` once, on a node of the cluster")
        if importlib.util.find_spec("ray") is None:
            raise ConfigError("config key 'launcher': ray is not installed (pip install 'agentrl[ray]')")
    if cfg.placement == "colocated" and (cfg.launcher == "ray" or cfg.nnodes > 1):
        raise ConfigError("config key 'placement': colocated runs on one machine with the local launcher; use "
                          "placement: decoupled with launcher ray or several nodes")
    if cfg.inference.router == "sglang" and importlib.util.find_spec("sglang_router") is None:
        raise ConfigError("config key 'inference.router': sglang-router is not installed "
                          "(pip install 'agentrl[router]')")


def takes_sandbox(env_id: str) -> bool:
    """Whether the registered environment's constructor takes a ``sandbox`` argument."""
    import inspect

    import gymnasium

    from agentrl.plugins import load_object

    entry = gymnasium.spec(env_id).entry_point
    make = load_object(entry) if isinstance(entry, str) else entry
    try:
        params = inspect.signature(make).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: assume it does
        return True
    return any(p.name == "sandbox" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)

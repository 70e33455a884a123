"""RunConfig: one YAML file for a whole training run (``agentrl train CONFIG [key=value ...]``).

What it is: the run's own keys (model, steps, ranks, nodes, launcher, placement, determinism),
its ``checkpoint``, ``logging`` and ``ray`` sections, and the sections each component declares
beside itself, composed: ``inference`` (``agentrl.run.inference_config``), ``rollout`` and
``eval`` (``agentrl.rollout.rollout_config``, ``agentrl.rollout.eval_config``), ``trainer``
(``agentrl.trainer.TrainerConfig``, η included), ``sandbox`` (``agentrl.env.sandbox_config``),
``gateway`` (``agentrl.rollout.gateway_config``). ``check_run_config`` refuses what cannot
exist (a missing model directory, an unknown env id or workflow, more GPUs than present)
before anything starts, in one line naming the key: one check per thing checked, each beside
what it checks (placement's in ``agentrl.run.placement``). ``build_workflow`` builds the
configured workflow with what it takes from the run (``agentrl.rollout.workflow_inputs``).
``agentrl train --help-config`` prints every key with its help.
What it is not: the launcher (``agentrl.run.local_launcher``) or the loop (``agentrl.run.loop``).
The names that moved beside their components are still importable from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.api import SamplingParams
from agentrl.config import option
from agentrl.env.datasets import SUFFIXES as DATA_SUFFIXES
from agentrl.env.datasets import check_dataset, dataset_file, dataset_rows
from agentrl.env.sandbox_config import SandboxConfig, takes_sandbox
from agentrl.errors import ConfigError
from agentrl.rollout.eval_config import EVAL_SCORE, EvalConfig, figure_scores, figure_value
from agentrl.rollout.gateway_config import GatewayConfig
from agentrl.rollout.lockstep import chunkable
from agentrl.rollout.record import RECORD_MAX_BYTES
from agentrl.rollout.rollout_config import RolloutConfig
from agentrl.rollout.workflow_inputs import WorkflowInputs, check_workflow_args
from agentrl.rollout.workflow_inputs import build_workflow as build_workflow_from
from agentrl.run.inference_config import (
    ENGINES,
    ROUTERS,
    InferenceConfig,
    apply_auto_engine,
    check_engine,
    check_vllm,
)
from agentrl.run.placement import (
    PLACEMENTS,
    apply_placement,
    apply_rollout_worker,
    check_gpus,
    check_placement,
    check_rollout_worker,
    choose_placement,
    rollout_stays_in_rank_0,
    usable_cores,
)
from agentrl.trainer.trainer_config import TrainerConfig

LAUNCHERS = ("local", "ray")

__all__ = [  # the run's own, and the names that moved beside their components (imported from here before)
    "DATA_SUFFIXES", "ENGINES", "EVAL_SCORE", "LAUNCHERS", "PLACEMENTS", "ROUTERS", "CheckpointConfig", "EvalConfig",
    "InferenceConfig", "LoggingConfig", "RayConfig", "RolloutConfig", "RunConfig", "SandboxConfig",
    "apply_deterministic", "apply_placement", "apply_rollout_worker", "build_workflow", "check_placement",
    "check_run_config", "check_vllm", "check_workflow_args", "choose_placement", "dataset_file", "dataset_rows",
    "figure_scores", "figure_value", "rollout_stays_in_rank_0", "takes_sandbox", "usable_cores",
]


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
             "decoupled otherwise; the run's first "
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


def build_workflow(cfg: RunConfig, sampling: SamplingParams, overrides: dict[str, Any] | None = None) -> Any:
    """The configured workflow (``rollout.workflow`` with ``rollout.workflow_args``, then
    ``overrides``), given what it declares it takes from the run, ``sampling`` as its sampling."""
    from agentrl.plugins import load_object

    inputs = WorkflowInputs(tokenizer=cfg.model, sampling=sampling, tool_call_parser=cfg.rollout.tool_call_parser,
                            reasoning_parser=cfg.rollout.reasoning_parser, sandbox=cfg.sandbox.spec())
    return build_workflow_from(load_object(cfg.rollout.workflow), {**cfg.rollout.workflow_args, **(overrides or {})},
                               inputs, name=cfg.rollout.workflow)


def check_weights(model: Path) -> None:
    """Refuse a model directory whose safetensors are missing or unreadable (one line, not the
    loader's traceback); the headers are read, not the weights."""
    from agentrl.client.checkpoint_check import read_headers
    from agentrl.errors import RequestRejected

    try:
        read_headers(model)
    except RequestRejected as e:
        raise ConfigError(f"config key 'model': {e}") from None


def check_run_config(cfg: RunConfig) -> None:
    """Refuse, before anything starts, what cannot work; each error names its config key. An
    ``inference.engine: auto`` is decided here, once the model is known (the line says which)."""
    check_model(cfg)
    if (line := apply_auto_engine(cfg)) is not None:
        print(f"agentrl: {line}", flush=True)
    check_rollout_worker(cfg)
    check_source(cfg)
    check_workflow(cfg)
    # the datasets first: a module that provides rows may also register its environment
    for key, spec in (("rollout.dataset", cfg.rollout.dataset), ("eval.dataset", cfg.eval.dataset)):
        if spec:
            check_dataset(key, spec)
    cfg.sandbox.check(check_env_id(cfg))
    check_placement(cfg)
    check_gpus(cfg)
    check_engine(cfg)
    if cfg.deterministic:
        check_deterministic(cfg)
    check_objective(cfg)
    cfg.rollout.check()


def check_objective(cfg: RunConfig) -> None:
    """A user's ``trainer.loss.kind: module:function`` is imported now, not once the servers are up."""
    if ":" in cfg.trainer.loss.kind:
        from agentrl.trainer.objective import resolve_objective

        resolve_objective(cfg.trainer.loss.kind)
    distill = cfg.trainer.distill
    if distill.enabled and distill.task_coef == 0 and cfg.rollout.filter_equal_rewards:
        raise ConfigError("config key 'rollout.filter_equal_rewards': it drops groups by their task reward, which "
                          "trainer.distill.task_coef: 0 leaves out of the update (every token still has the "
                          "teacher's signal); set it to false, or give the task reward a weight")


def check_model(cfg: RunConfig) -> None:
    """``model`` is a model directory, whose context leaves room for a prompt."""
    model = Path(cfg.model)
    if not (model / "config.json").is_file():
        raise ConfigError(f"config key 'model': {cfg.model!r} is not a model directory (no config.json); "
                          "build the demo one with `agentrl model tiny --out DIR`")
    check_weights(model)
    check_context(cfg, model)


def check_source(cfg: RunConfig) -> None:
    """What ``rollout.source`` needs: a gateway reachable only with a key off loopback, recorded
    steps that fit this run, or rows to play."""
    if cfg.rollout.source == "gateway":
        import ipaddress
        import os

        host = cfg.gateway.host
        loopback = host == "localhost" or (host.replace(".", "").isdigit() and ipaddress.ip_address(host).is_loopback)
        if not loopback and not os.environ.get(cfg.gateway.api_key_env):
            raise ConfigError(f"config key 'gateway.host': {host!r} is not a loopback address and "
                              f"${cfg.gateway.api_key_env} holds no API key; set one, or serve on 127.0.0.1")
        if cfg.gateway.agent_sampling != "policy":
            raise ConfigError("config key 'gateway.agent_sampling': a run trains on what its gateway samples, and the "
                              "trainer recomputes log-probabilities at temperature 1; keep it policy (the default)")
    elif cfg.rollout.recorded is not None:
        check_recorded(cfg)
    elif not cfg.rollout.dataset:
        raise ConfigError("config key 'rollout.dataset' is required: a .jsonl file or 'module:function' "
                          "giving the rows to play (e.g. envs.arith:training_rows)")


def check_workflow(cfg: RunConfig) -> None:
    """``rollout.workflow`` imports, and takes the arguments the rollouts and the evaluation give."""
    from agentrl.plugins import load_object

    try:
        workflow = load_object(cfg.rollout.workflow)
    except ConfigError as e:
        raise ConfigError(f"config key 'rollout.workflow': {e}") from e
    for key, args in (("rollout.workflow_args", cfg.rollout.workflow_args), ("eval.workflow_args", cfg.eval.workflow_args)):
        check_workflow_args(workflow, cfg.rollout.workflow, args, key)


def check_env_id(cfg: RunConfig) -> str | None:
    """The registered env ``rollout.workflow_args.env_id`` names (None: it names none)."""
    env_id = cfg.rollout.workflow_args.get("env_id")
    if env_id is None:
        return None
    from agentrl.plugins import find_env

    try:
        return find_env(env_id)
    except ConfigError as e:
        raise ConfigError(f"config key 'rollout.workflow_args.env_id': {e}") from e


def check_recorded(cfg: RunConfig) -> None:
    """``rollout.source`` a path: recorded steps that this run's batches can be, one for one."""
    from agentrl.rollout.recorded import RecordedEpisodes, model_vocab_size

    try:
        recorded = RecordedEpisodes(cfg.rollout.recorded, model_vocab_size(cfg.model))
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

"""TrainerConfig: every setting of the trainer, as typed, documented dataclasses.

What it is: the ``trainer:`` section of a run's YAML (loaded with ``agentrl.config``), split
into the loss, the advantages, the optimization and how weights reach the servers
(``weight_sync``); on-policy distillation's section (``distill``) lives beside its math in
``agentrl.trainer.distill``. What it is not: the rollout side's settings (concurrency, sampling), which
live beside the rollout executor; ``max_staleness`` (η) is here because the trainer enforces
it on every batch.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Literal

from agentrl.config import option
from agentrl.errors import ConfigError
from agentrl.trainer.distill import DistillConfig

LossKind = Literal["decoupled_ppo", "ppo", "reinforce", "gspo", "cispo"]
LOSS_KINDS: tuple[str, ...] = ("decoupled_ppo", "ppo", "reinforce", "gspo", "cispo")
"""The built-in objectives of ``agentrl.trainer.losses`` (``trainer.loss.kind``); a
``module:function`` path names one of the user's own (``agentrl.trainer.objective``)."""
AGGREGATIONS: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
"""How token losses become one number (``trainer.loss.aggregation``, ``aggregation_weights``)."""
ADVANTAGE_KINDS: tuple[str, ...] = ("group_norm", "rloo", "reinforce_pp", "gae", "turn")
"""The estimators of ``agentrl.trainer.advantages`` (``trainer.advantages.kind``)."""
ADAPTER_MODES: tuple[str, ...] = ("auto", "merge", "load")
"""How a LoRA run's adapters reach the servers (``trainer.weight_sync.adapters``, ``DiskTransport``,
``DistributedTransport``)."""
MISMATCH_MODES: tuple[str, ...] = ("off", "tis", "mis")
"""Engine-trainer mismatch corrections (``trainer.loss.mismatch.mode``, ``agentrl.trainer.mismatch``)."""


@dataclass
class MismatchConfig:
    """Importance weights between the engine's log-probabilities (π_behav) and the trainer's
    recomputation (π_prox) of the same tokens (``agentrl.trainer.mismatch``)."""

    mode: str = option("off", choices=MISMATCH_MODES,
                       help="off: the objective's own behaviour weight (decoupled_ppo: π_prox/π_behav, masked above "
                            "loss.behaviour_weight_cap); tis: truncated, min(ρ, upper); mis: masked, ρ kept where "
                            "lower <= ρ <= upper and the token (or sequence) dropped elsewhere")
    level: str = option("token", choices=("token", "sequence"),
                        help="token: ρ per token; sequence: ρ = the product over the sequence's loss tokens, one "
                             "weight (or one mask) for all of them")
    upper: float = option(2.0, gt=1.0, help="tis: the truncation C of min(ρ, C); mis: the largest ρ kept")
    lower: float = option(0.0, ge=0.0, lt=1.0, help="mis: the smallest ρ kept (0 keeps every small ρ)")


@dataclass
class LossConfig:
    """The policy objective (see ``agentrl.trainer.losses`` and ``agentrl.trainer.objective``)."""

    kind: str = option("decoupled_ppo",
                       help="decoupled_ppo (async RL, π_prox from a forward pass before the update), "
                            "ppo (π_prox = π_behav), reinforce (-A·log π, no ratio), gspo (one clipped ratio per "
                            "sequence, its tokens' geometric mean), cispo (the clipped ratio as a detached weight "
                            "on -A·log π: every token keeps a gradient), or 'module:function', a loss of your own "
                            "(docs/guides/algorithms.md)")
    aggregation: str = option("token-mean", choices=AGGREGATIONS,
                              help="token-mean: Σ l / (loss tokens of the mini-batch); seq-mean-token-mean: each "
                                   "sequence's token mean, averaged over sequences (GSPO's form); seq-mean-token-sum: "
                                   "each sequence's token sum, averaged over sequences (Dr. GRPO: no length bias)")
    eps_low: float = option(0.2, ge=0.0, lt=1.0, help="lower clip: the ratio is clipped at 1 - eps_low "
                                                      "(gspo's paper: 3e-4; cispo's: no lower bound, e.g. 0.99)")
    eps_high: float = option(0.2, ge=0.0, help="upper clip: the ratio is clipped at 1 + eps_high "
                                                "(a larger value than eps_low, e.g. 0.28, keeps exploring; "
                                                "gspo's paper: 4e-4)")
    behaviour_weight_cap: float | None = option(
        5.0, gt=1.0, help="decoupled_ppo, gspo, cispo: tokens with π_prox/π_behav above this are masked out; null "
                          "keeps all (with mismatch.mode tis or mis, that rule replaces this one)")
    kl_coef: float = option(0.0, ge=0.0, help="weight of the k3 KL penalty against the frozen initial "
                                              "model; > 0 loads a second (reference) copy of the model")
    mismatch: MismatchConfig = option(MismatchConfig, help="engine-trainer mismatch correction (TIS / MIS)")

    def __post_init__(self) -> None:
        if ":" in self.kind:
            return  # a user's objective: agentrl.trainer.objective.resolve_objective imports and checks it
        if self.kind not in LOSS_KINDS:
            close = difflib.get_close_matches(self.kind, LOSS_KINDS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"config key 'trainer.loss.kind': got {self.kind!r}, expected one of {list(LOSS_KINDS)} "
                              f"or 'module:function' (a loss of your own){hint}")
        if self.kind == "ppo" and self.mismatch.mode != "off":
            raise ConfigError("config key 'trainer.loss.mismatch.mode': ppo anchors its ratio on π_behav itself, so "
                              "there is no recomputation to correct against; use loss.kind: decoupled_ppo with "
                              f"mismatch.mode: {self.mismatch.mode}")


@dataclass
class AdvantageConfig:
    """From rewards to advantages (see ``agentrl.trainer.advantages``)."""

    kind: str = option("group_norm", choices=ADVANTAGE_KINDS,
                       help="group_norm: reward minus its group's mean, divided by the group's std (GRPO; "
                            "std_normalize: false is Dr. GRPO's); rloo: reward minus the mean of the other samples "
                            "of its group; reinforce_pp: the reward normalised over the whole batch's loss tokens "
                            "(REINFORCE++; no group baseline); gae: token advantages from a value model trained "
                            "beside the actor (trainer.critic; PPO's GAE); turn: GiGPO's episode advantage plus "
                            "turn_weight times a per-turn advantage among equal states (agentrl.trainer.turns)")
    gamma: float = option(1.0, ge=0.0, le=1.0, help="gae, turn: the discount γ per token (gae) or per turn (turn)")
    lam: float = option(1.0, ge=0.0, le=1.0, help="gae: GAE's λ (1: the return minus the value; 0: TD(0))")
    turn_weight: float = option(1.0, ge=0.0, help="turn: ω, the weight of the per-turn (step) advantage added "
                                                  "to the episode's (GiGPO; 0: group_norm alone)")
    reward_scale: float = option(1.0, gt=0.0, help="rewards are (r + reward_bias) * reward_scale ...")
    reward_bias: float = option(0.0, help="... added before scaling")
    reward_clip: float | None = option(None, gt=0.0, help="... then clipped to ±reward_clip; null: no clip")
    overlong_max_tokens: int | None = option(
        None, ge=1, help="DAPO's overlong penalty: a trajectory of more sampled tokens than this gets "
                         "-overlong_penalty added to its reward, and one in the last overlong_buffer_tokens before "
                         "it a linear share of that; null: off")
    overlong_buffer_tokens: int = option(0, ge=0, help="the soft buffer L_cache of the overlong penalty (0: only "
                                                        "the hard penalty past overlong_max_tokens)")
    overlong_penalty: float = option(1.0, ge=0.0, help="the overlong penalty's size (DAPO: 1)")
    std_normalize: bool = option(True, help="group_norm: divide by the group's reward std (GRPO); false: Dr. GRPO")
    batch_normalize: bool = option(False, help="then normalize advantages over the batch's loss tokens")

    def __post_init__(self) -> None:
        if self.overlong_max_tokens is not None and self.overlong_buffer_tokens >= self.overlong_max_tokens:
            raise ConfigError(f"config key 'trainer.advantages.overlong_buffer_tokens': "
                              f"{self.overlong_buffer_tokens} must be below overlong_max_tokens="
                              f"{self.overlong_max_tokens} (the buffer is the last tokens before the limit)")


@dataclass
class CriticConfig:
    """The value model of ``trainer.advantages.kind: gae`` (``agentrl.trainer.critic``): a copy of a
    causal LM's body with a scalar head, FSDP2 like the actor, with an optimizer of its own."""

    model: str | None = option(None, help="the value model's starting point (an HF model directory); null: the "
                                          "policy's model. Its LM head is dropped and a scalar head added")
    lr: float = option(1e-5, gt=0.0, help="the value model's AdamW learning rate (constant after warmup_steps)")
    value_clip: float | None = option(0.2, gt=0.0, help="PPO's value clip: a new value moves at most this far from "
                                                        "the one GAE used; null: an unclipped squared error")
    value_coef: float = option(0.5, gt=0.0, help="the value loss's coefficient (its gradient's scale, before "
                                                 "trainer.grad_clip)")


WEIGHT_TRANSPORTS = ("disk", "distributed")


@dataclass
class WeightSyncConfig:
    """How each new policy version reaches the inference servers (``agentrl.trainer.publish``)."""

    transport: str = option("disk", choices=WEIGHT_TRANSPORTS,
                            help="disk: rank 0 writes an HF checkpoint to RUN_DIR/weights and every server loads "
                                 "it (a filesystem they all mount); distributed: rank 0 broadcasts the tensors to "
                                 "every server over a torch.distributed group of its own (SGLang's "
                                 "/update_weights_from_distributed; gloo on CPU, NCCL on GPUs); a LoRA run's "
                                 "adapter goes either way, broadcast to agentrl serve only")
    backend: str = option("auto", choices=("auto", "gloo", "nccl"),
                          help="distributed: the group's backend; auto = nccl when the trainer runs on cuda, "
                               "else gloo (agentrl serve on CPU takes gloo only)")
    master_address: str | None = option(None, help="distributed: the address of trainer rank 0 that every server "
                                                   "reaches; null = MASTER_ADDR (rank 0's address, as "
                                                   "torchrun and the Ray launcher set it)")
    master_port: int = option(0, ge=0, le=65535, help="distributed: the group's port on rank 0; 0 = a free one")
    bucket_mb: float = option(512.0, gt=0, help="distributed: tensors sent per /update_weights_from_distributed "
                                                "request, in MiB (a larger tensor goes alone; a LoRA adapter "
                                                "goes whole, in one request)")
    flatten: bool = option(True, help="distributed: send each bucket as SGLang's flattened_bucket (one collective "
                                      "for all its tensors' bytes); false: one collective per tensor")
    timeout_s: float = option(600.0, gt=0, help="distributed: seconds joining the group or one broadcast may take")
    overlap: bool = option(True, help="distributed: broadcast the buckets while the servers generate (they receive "
                                      "them into a staging copy) and pause them only to swap it in; needs agentrl "
                                      "serve, SGLang servers get every bucket inside the pause whatever this says; "
                                      "false: inside the pause everywhere, as SGLang's own protocol")
    adapters: str = option("auto", choices=ADAPTER_MODES,
                           help="a LoRA run's adapters, which alone travel (a peft directory on disk, or their "
                                "tensors by broadcast: agentrl serve only): merge: each update merges the adapter "
                                "into the servers' base weights (agentrl serve only; staged before the pause); "
                                "load: every server loads it by name before the pause (SGLang's /load_lora_adapter, "
                                "agentrl-policy-v<version>) and from the pause on every request names it "
                                "(lora_path; applied per request); auto: merge on agentrl serve, load on SGLang")

    def backend_for(self, device: str) -> str:
        """The group's backend for trainer ranks on ``device`` (``backend: auto`` resolved)."""
        return self.backend if self.backend != "auto" else ("nccl" if device == "cuda" else "gloo")


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The Llama/Qwen linear projections an adapter may target: attention, then MLP (the modules
``agentrl serve`` merges an adapter into)."""


@dataclass
class LoraConfig:
    """Low-rank adapters instead of full fine-tuning (``agentrl.trainer.lora``, built on peft): the
    base weights stay frozen, only ``B @ A`` per targeted projection trains, and a publish moves
    only the adapter."""

    rank: int = option(0, ge=0, help="r, the adapters' rank; 0 = no LoRA (every weight trains)")
    alpha: float = option(32.0, gt=0.0, help="lora_alpha: the update B @ A is scaled by alpha / rank")
    dropout: float = option(0.0, ge=0.0, lt=1.0, help="dropout on the adapters' input while training (not in "
                                                      "the no-grad π_prox pass; 0 keeps the two passes equal)")
    target_modules: list[str] = option(list(LORA_TARGETS), help="the projections that get an adapter, of "
                                       + ", ".join(LORA_TARGETS))

    def __post_init__(self) -> None:
        unknown = [m for m in self.target_modules if m not in LORA_TARGETS]
        if unknown or not self.target_modules or len(set(self.target_modules)) != len(self.target_modules):
            raise ConfigError(f"config key 'trainer.lora.target_modules': expected distinct names among "
                              f"{', '.join(LORA_TARGETS)}, got {self.target_modules!r}")

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass
class TrainerConfig:
    """The ``trainer:`` section."""

    lr: float = option(1e-5, gt=0.0, help="peak learning rate of AdamW")
    weight_decay: float = option(0.0, ge=0.0, help="AdamW decoupled weight decay")
    betas: list[float] = option([0.9, 0.999], help="AdamW (beta1, beta2)")
    adam_eps: float = option(1e-8, gt=0.0, help="AdamW epsilon")
    warmup_steps: int = option(0, ge=0, help="optimizer steps of linear warmup from 0 to lr")
    total_steps: int = option(1000, ge=1, help="optimizer steps of the cosine schedule (after warmup)")
    min_lr_ratio: float = option(0.0, ge=0.0, le=1.0, help="the cosine ends at lr * min_lr_ratio")
    grad_clip: float = option(1.0, ge=0.0, help="clip the global grad norm to this; 0 disables clipping")
    num_mini_batches: int = option(1, ge=1, help="optimizer steps per train_step (the batch is split in order)")
    micro_batch_tokens: int = option(4096, ge=1, help="token budget of one packed micro-batch on one rank; "
                                                      "a longer sequence gets a micro-batch of its own")
    max_staleness: int = option(4, ge=0, help="η: drop trajectories whose oldest token is more than η "
                                             "versions behind the trainer (0 = synchronous RL)")
    dtype: str = option("auto", choices=("auto", "float32", "bfloat16"),
                        help="compute dtype; auto = bfloat16 on GPUs that support it, float32 on CPU. "
                             "Master weights and gradient reduction stay float32")
    attn_implementation: str = option(
        "auto", choices=("auto", "sdpa_segments", "sdpa", "eager", "flash_attention_2"),
        help="attention over packed rows. auto = flash_attention_2 (varlen) on GPUs with flash-attn and a "
             "16-bit dtype, else sdpa_segments (causal SDPA calls per packed sequence or shared prefix); "
             "sdpa/eager use an explicit [T, T] mask")
    share_prefix: bool = option(True, help="pack the sequences of one group (same episode prompt) behind one copy "
                                "of their common prefix: the same gradients on fewer tokens. Not with "
                                "flash_attention_2, whose varlen rows cannot say that a suffix sees a prefix")
    gradient_checkpointing: bool = option(False, help="recompute activations in backward (less memory)")
    seed: int = option(0, help="seed of the trainer's RNGs")
    loss: LossConfig = option(LossConfig, help="the policy objective")
    advantages: AdvantageConfig = option(AdvantageConfig, help="rewards to advantages")
    weight_sync: WeightSyncConfig = option(WeightSyncConfig, help="how new weights reach the inference servers")
    lora: LoraConfig = option(LoraConfig, help="LoRA adapters (off unless lora.rank > 0)")
    distill: DistillConfig = option(DistillConfig, help="on-policy distillation from a teacher server (off unless "
                                                        "distill.teacher.url is set)")
    critic: CriticConfig = option(CriticConfig, help="the value model (advantages.kind gae only)")

    def __post_init__(self) -> None:
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"config key 'betas': expected two numbers in [0, 1), got {self.betas!r}")
        if self.advantages.kind == "gae" and self.distill.enabled:
            raise ConfigError("config key 'trainer.advantages.kind': gae's advantages come from the critic after "
                              "trainer.distill has set its own, so the two do not combine yet; use another kind "
                              "with distill, or leave distill.teacher.url empty")

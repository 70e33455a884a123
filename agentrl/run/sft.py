"""Supervised fine-tuning with the RL trainer's machinery: ``agentrl sft CONFIG``.

What it is: ``run_sft(cfg, run_dir)`` on every trainer rank — the data of ``agentrl.run.sft_data``
(conversations masked as rollouts mask sampled tokens, or recorded trajectories as they are),
a held-out split, and the ``Actor`` of ``agentrl train`` (FSDP2, packing, AdamW, warmup +
cosine, gradient clipping, skipped non-finite steps) stepping on batches whose advantage is 1
on every loss token: its ``reinforce`` loss is then exactly the token-mean negative
log-likelihood of the assistant tokens. The held-out loss is the same mean under
``Actor.compute_logprobs`` (no gradient), before, every ``eval_every_steps`` and after. The
fine-tuned weights are exported with the trainer's ``export_hf`` to ``RUN_DIR/model``, an HF
directory that ``agentrl serve --model`` (and ``agentrl train``'s ``model``) loads. With
``trainer.lora`` only the adapters train; the adapter is exported (``export_adapter``) to
``RUN_DIR/adapter`` in peft's format and merged into the base (peft's merge) as ``RUN_DIR/model``.

    parse (the command) → data (load, split) → Actor (restored on --resume) → held-out loss before
    loop: batch (shuffled per epoch) → Actor.train_step → metrics.jsonl (every step),
          a progress line every log_every_steps, held-out loss every eval_every_steps,
          a checkpoint every checkpoint.every_steps
    held-out loss after → export_hf → checkpoint → summary.json, curves.png

Resuming: a checkpoint is the trainer's own (``save_checkpoint``: model and optimizer shards,
schedule, RNG, counters) plus ``sft.json`` (the step, the held-out loss before, the minutes so
far). The batch order is a pure function of (seed, data, step), so ``--resume`` skips the
batches already trained on and continues as if never stopped; the metrics logged after the
checkpoint are dropped. A resume with a larger ``steps`` trains a finished run on.

How it runs: in the calling process as a 1-rank gloo group (``run_in_process``), or under
torchrun as ``python -m agentrl.run.sft RUN_DIR [--resume]`` (reading ``RUN_DIR/config.yaml``)
when ``world_size`` > 1; every rank loads the same data, rank 0 writes and prints. What it is
not: a generation-based evaluation (``agentrl eval`` on the exported model does that).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError, TrainerError
from agentrl.run.sft_config import SftConfig
from agentrl.run.sft_data import SftData, SftExample, SftRecord, load_examples

MODEL_DIR = "model"
ADAPTER_DIR = "adapter"
"""``RUN_DIR/model``: the fine-tuned HF checkpoint."""
CHECKPOINTS, LATEST, STATE = "checkpoints", "latest", "sft.json"
"""``RUN_DIR/checkpoints/step_NNNNNN/{trainer/, sft.json}``; ``checkpoints/latest`` names the newest."""


# --------------------------------------------------------------------------- data


def load_data(cfg: SftConfig) -> tuple[SftData, SftData]:
    """(training data, held-out data): ``cfg.heldout`` when given, else ``cfg.heldout_fraction``
    of the training records (whole records: a conversation's segments stay on one side)."""
    from agentrl.rollout.recorded import model_vocab_size
    from agentrl.rollout.renderer import ChatRenderer

    renderer = ChatRenderer(cfg.model)
    limit = model_positions(cfg.model)  # an example past the model's context is dropped and counted, as max_tokens'
    max_tokens = min((n for n in (cfg.max_tokens, limit) if n is not None), default=None)
    vocab_size = model_vocab_size(cfg.model)
    load = lambda specs: load_examples(specs, renderer, seed=cfg.seed, min_reward=cfg.min_reward,  # noqa: E731
                                       max_tokens=max_tokens, vocab_size=vocab_size)
    train = load(cfg.data)
    if not train.records:
        raise ConfigError(f"config key 'data': no training example left in {cfg.data} "
                          f"(dropped: {dict(train.dropped) or 'none'}); check min_reward and max_tokens")
    if cfg.heldout:
        return train, load(cfg.heldout)
    n = round(len(train.records) * cfg.heldout_fraction)
    if cfg.heldout_fraction == 0 or n == 0 or n == len(train.records):
        return train, SftData([])
    order = list(range(len(train.records)))
    random.Random(cfg.seed).shuffle(order)
    held = set(order[:n])
    records: list[SftRecord] = train.records
    return (SftData([r for i, r in enumerate(records) if i not in held], train.dropped),
            SftData([r for i, r in enumerate(records) if i in held]))


def model_positions(model_dir: str | Path) -> int | None:
    """The model's ``max_position_embeddings`` (None: its config.json does not say)."""
    try:
        return int(json.loads((Path(model_dir) / "config.json").read_text())["max_position_embeddings"])
    except (OSError, ValueError, TypeError, KeyError):
        return None


def train_batch(examples: Sequence[SftExample], version: int = 0) -> Any:
    """A ``TrainBatch`` of ``examples`` for the actor: advantage 1 and no behaviour
    log-probabilities on loss tokens, so its ``reinforce`` loss is the token-mean NLL."""
    import torch

    from agentrl.trainer.batch import TrainBatch

    sequences = []
    for e in examples:
        mask = torch.tensor(e.loss_mask, dtype=torch.float32)
        sequences.append({"input_ids": torch.tensor(e.input_ids, dtype=torch.long), "loss_mask": mask,
                          "behaviour_logprobs": torch.zeros_like(mask), "advantages": mask.clone()})
    return TrainBatch(sequences, version)


def batch_stream(examples: Sequence[SftExample], batch_size: int, seed: int) -> Iterator[list[SftExample]]:
    """Batches of ``batch_size`` forever, each epoch in its own seeded order (a batch may span
    two epochs)."""
    epoch, buffer = 0, []
    while True:
        order = list(range(len(examples)))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        for i in order:
            buffer.append(examples[i])
            if len(buffer) == batch_size:
                yield buffer
                buffer = []
        epoch += 1


def num_steps(cfg: SftConfig, num_examples: int) -> int:
    if cfg.steps is not None:
        return cfg.steps
    return max(1, math.ceil(cfg.epochs * math.ceil(num_examples / cfg.batch_size)))


def heldout_loss(actor: Any, batch: Any) -> float | None:
    """Token-mean NLL of ``batch``'s loss tokens under the actor's weights (a collective)."""
    import torch
    import torch.distributed as dist

    if batch is None or len(batch) == 0:
        return None
    logprobs = actor.compute_logprobs(batch)
    nll = sum(float(-(lp * batch.sequences[i]["loss_mask"]).sum()) for i, lp in logprobs.items())
    tokens = sum(float(batch.sequences[i]["loss_mask"].sum()) for i in logprobs)
    t = torch.tensor([nll, tokens], dtype=torch.float64, device=actor.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t[0] / t[1]) if t[1] > 0 else None


# --------------------------------------------------------------------------- checkpoints


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of an SFT run (``checkpoints/latest`` names it), or None."""
    pointer = Path(run_dir) / CHECKPOINTS / LATEST
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if (path / STATE).is_file() else None


def completed_steps(run_dir: str | Path) -> int:
    """Steps done by the newest checkpoint (0 without one)."""
    path = latest_checkpoint(run_dir)
    return json.loads((path / STATE).read_text())["step"] if path is not None else 0


def save_state(actor: Any, run_dir: Path, step: int, state: dict[str, Any], keep_last: int) -> Path:
    """The trainer's shards and counters (``save_checkpoint``, a collective), then (rank 0) the
    run's own state and the ``latest`` pointer, which make it complete; older ones beyond
    ``keep_last`` are removed."""
    from agentrl.trainer.checkpoint import save_checkpoint

    path = run_dir / CHECKPOINTS / f"step_{step:06d}"
    save_checkpoint(actor, path / "trainer")
    if actor.rank == 0:
        (path / STATE).write_text(json.dumps({"step": step, **state}))
        pointer = run_dir / CHECKPOINTS / LATEST
        tmp = pointer.with_suffix(".tmp")
        tmp.write_text(path.name)
        os.replace(tmp, pointer)
        for old in sorted(p for p in path.parent.glob("step_*") if p.is_dir())[:-keep_last]:
            if old != path:
                shutil.rmtree(old, ignore_errors=True)
    return path


# --------------------------------------------------------------------------- the run


def run_sft(cfg: SftConfig, run_dir: str | Path, *, data: tuple[SftData, SftData] | None = None,
            resume: bool = False) -> dict[str, Any]:
    """Fine-tune ``cfg.model`` on ``cfg.data`` (module docstring); on every rank, after the
    process group exists. ``resume``: continue from the newest checkpoint of ``run_dir`` (from
    step 0, its metrics dropped, when there is none). Returns the summary (rank 0; others
    return an empty dict)."""
    import torch

    from agentrl.run.metrics import RunLog, plot_curves
    from agentrl.trainer.actor import Actor, init_distributed
    from agentrl.trainer.checkpoint import load_checkpoint

    started = time.perf_counter()
    run_dir = Path(run_dir)
    torch.set_num_threads(cfg.threads)
    rank, _, _ = init_distributed()
    lead = rank == 0
    say = (lambda msg: print(msg, flush=True)) if lead else (lambda msg: None)
    train, held = data if data is not None else load_data(cfg)
    examples, held_examples = train.examples, held.examples
    steps = num_steps(cfg, len(examples))
    dropped = dict(train.dropped + held.dropped)
    say(f"sft: {len(examples)} training examples ({sum(e.num_loss_tokens for e in examples)} loss tokens) "
        f"from {len(train.records)} records, {len(held_examples)} held out; {steps} steps of {cfg.batch_size}"
        + (f"; dropped {dropped}" if dropped else ""))
    if not held_examples:
        say("sft: no held-out data (heldout is empty and heldout_fraction leaves none): no held-out loss")

    trainer_cfg = dataclasses.replace(cfg.trainer, loss=dataclasses.replace(cfg.trainer.loss, kind="reinforce"))
    actor = Actor(cfg.model, trainer_cfg)
    resume_from = latest_checkpoint(run_dir) if resume else None
    state: dict[str, Any] = {"minutes": 0.0}
    if resume_from is not None:
        load_checkpoint(actor, resume_from / "trainer")
        state = json.loads((resume_from / STATE).read_text())
        say(f"sft: resumed from {resume_from.name} (step {state['step']} of {steps})")
    start = state.get("step", 0)
    held_batch = train_batch(held_examples) if held_examples else None
    resume_step = None if not resume else start if resume_from is not None else -1
    runlog = RunLog(run_dir, tensorboard=cfg.tensorboard, trajectories_per_step=0,
                    resume_step=resume_step) if lead else None

    def evaluate(step: int, label: str) -> float | None:
        loss = heldout_loss(actor, held_batch)
        if loss is not None:
            if runlog is not None:
                runlog.log(step, {"eval/heldout_loss": loss})
            say(f"heldout loss {label} (step {step}): {loss:.4f}")
        return loss

    def minutes() -> float:
        return state["minutes"] + (time.perf_counter() - started) / 60

    summary: dict[str, Any] = {"heldout_loss_before": state["heldout_loss_before"] if resume_from is not None
                               else evaluate(0, "before")}
    stream = batch_stream(examples, min(cfg.batch_size, len(examples)), cfg.seed)
    for _ in range(start):  # the batches the checkpointed steps trained on
        next(stream)
    t_last = time.perf_counter()
    try:
        for step in range(start + 1, steps + 1):
            batch = next(stream)
            stats = actor.train_step(train_batch(batch, actor.version))
            now = time.perf_counter()
            if runlog is not None:
                row = {f"train/{k}": stats.get(k, math.nan) for k in ("loss", "entropy", "grad_norm", "lr")}
                runlog.log(step, row | {"train/loss_tokens": float(sum(e.num_loss_tokens for e in batch)),
                                        "train/skipped_steps": stats.get("skipped_steps", 0.0),
                                        "perf/step_s": now - t_last, "perf/elapsed_min": minutes()})
            t_last = now
            if step % cfg.log_every_steps == 0 or step == steps:
                say(f"sft step {step:>4}/{steps}  loss {stats.get('loss', math.nan):.4f}  "
                    f"lr {stats.get('lr', math.nan):.2e}  [{minutes():.1f} min]")
            if cfg.eval_every_steps and step % cfg.eval_every_steps == 0 and step < steps:
                evaluate(step, "at")
            if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0 and step < steps:
                save_state(actor, run_dir, step, {"heldout_loss_before": summary["heldout_loss_before"],
                                                  "minutes": minutes()}, cfg.checkpoint.keep_last)
        summary["heldout_loss_after"] = evaluate(steps, "after")
        checkpoint = export(actor, cfg, run_dir)
        save_state(actor, run_dir, steps, {"heldout_loss_before": summary["heldout_loss_before"],
                                           "minutes": minutes()}, cfg.checkpoint.keep_last)
    finally:
        if runlog is not None:
            runlog.close()
    if not lead:
        return {}
    summary.update(steps=steps, minutes=minutes(), run_dir=str(run_dir),
                   checkpoint=str(checkpoint), train_examples=len(examples), heldout_examples=len(held_examples),
                   dropped=dropped, skipped_steps=actor.skipped_steps)
    if resume_from is not None:
        summary["resumed_from_step"] = start
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    plot_curves(run_dir)
    return summary


def export(actor: Any, cfg: SftConfig, run_dir: Path) -> Path:
    """The fine-tuned model as an HF directory at ``RUN_DIR/model`` (every rank calls this); a
    LoRA model's adapter also at ``RUN_DIR/adapter``, merged into the base for ``model``."""
    import torch.distributed as dist

    from agentrl.trainer.checkpoint import export_adapter, export_hf

    if not cfg.trainer.lora.enabled:
        return export_hf(actor.model, run_dir / MODEL_DIR, source_dir=cfg.model)
    from agentrl.trainer.lora import merge_adapter

    adapter = export_adapter(actor.model, run_dir / ADAPTER_DIR)
    if dist.get_rank() == 0:
        merge_adapter(adapter, run_dir / MODEL_DIR, base_dir=cfg.model)
    dist.barrier()
    return run_dir / MODEL_DIR


def run_in_process(cfg: SftConfig, run_dir: str | Path, *, data: tuple[SftData, SftData] | None = None,
                   resume: bool = False) -> dict:
    """``run_sft`` in this process as a 1-rank group (gloo on CPU), torn down afterwards."""
    from agentrl.run.local_launcher import one_rank_group

    with one_rank_group():
        return run_sft(cfg, run_dir, data=data, resume=resume)


def run_under_torchrun(cfg: SftConfig, run_dir: str | Path, *, resume: bool = False) -> dict:
    """``world_size`` ranks of ``python -m agentrl.run.sft RUN_DIR`` (its config.yaml is written)
    under torchrun on this machine; returns rank 0's summary."""
    from agentrl.process.services import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(cfg.world_size),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "agentrl.run.sft", str(run_dir)]
    code = subprocess.run(cmd + (["--resume"] if resume else [])).returncode
    if code != 0:
        raise TrainerError(f"the SFT ranks failed (torchrun exit code {code}); their output is above")
    return json.loads((Path(run_dir) / "summary.json").read_text())


def main(argv: list[str] | None = None) -> int:
    from transformers.utils import logging as hf_logging

    from agentrl.config import load_config

    args = list(sys.argv[1:] if argv is None else argv)
    resume = "--resume" in args
    args = [a for a in args if a != "--resume"]
    if len(args) != 1:
        print("usage: python -m agentrl.run.sft RUN_DIR [--resume]   (run by `agentrl sft` under torchrun)",
              file=sys.stderr)
        return 2
    hf_logging.disable_progress_bar()
    run_dir = Path(args[0])
    cfg = load_config(SftConfig, run_dir / "config.yaml")
    run_sft(cfg, run_dir, resume=resume)
    import torch.distributed as dist

    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

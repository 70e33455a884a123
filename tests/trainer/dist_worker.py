"""Test-only torchrun worker: a few deterministic train steps, with optional checkpoint/export.

    python -m torch.distributed.run --nproc_per_node=N tests/trainer/dist_worker.py \
        MODEL_DIR OUT.pt [--steps K] [--save-after S CKPT] [--restore CKPT] [--export DIR]
        [--lr LR] [--publish SERVER_URL --publish-root DIR [--transport disk|distributed]]
        [--kill-after-save] [--critic]

Rank 0 writes OUT.pt: {"stats": [per-step stats], "weights_after_first": {name: tensor},
"weights_final": {...}, "world_size": N, "publish": [...]}. With --publish, the weights are
published to a real ``agentrl serve`` after every step (rank 0 drives the client), through
files or (``--transport distributed``) by broadcast over a gloo group with the server. With
--kill-after-save, every rank SIGKILLs itself right after the checkpoint is written (OUT.pt
then holds what was done so far): no clean shutdown, no flush. With --critic the advantages are
``gae``'s from a value model trained beside the actor (``agentrl.trainer.critic``, as ``agentrl
train`` runs it): each step's stats gain its ``critic/...`` ones, OUT.pt its ``critic_after_first``
and ``critic_final`` weights, and --save-after / --restore its checkpoint in ``CKPT-critic``. The batch of each step is a pure function of the step number, so runs with different
world sizes see the same data.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal

import torch
import torch.distributed as dist

from agentrl.api import Trajectory
from agentrl.trainer.actor import Actor
from agentrl.trainer.batch import broadcast_trajectories, prepare_batch
from agentrl.trainer.checkpoint import export_hf, load_checkpoint, save_checkpoint
from agentrl.trainer.trainer_config import AdvantageConfig, CriticConfig, LossConfig, TrainerConfig


def make_trajectories(step: int, version: int) -> list[Trajectory]:
    """4 groups x 3 samples of mixed lengths: prompt tokens (not trained) + sampled tokens."""
    rng = random.Random(1000 + step)
    out = []
    for g in range(4):
        prompt = [rng.randrange(256) for _ in range(rng.choice([3, 6, 11]))]
        for s in range(3):
            n = rng.choice([2, 5, 9, 23])
            resp = [rng.randrange(256) for _ in range(n)]
            out.append(Trajectory(
                input_ids=prompt + resp,
                loss_mask=[0] * len(prompt) + [1] * n,
                logprobs=[0.0] * len(prompt) + [-5.6 + rng.uniform(-0.3, 0.3) for _ in range(n)],
                versions=[-1] * len(prompt) + [version] * n,
                reward=float(rng.random() < 0.5) + 0.1 * s,
                group_id=f"s{step}g{g}", episode_id=f"s{step}g{g}e{s}",
            ))
    return out


def full_weights(actor: Actor) -> dict[str, torch.Tensor]:
    """The full (unsharded) weights of ``actor``'s model (or a ``Critic``'s: it has one too)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(actor.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.clone() for k, v in sd.items()}


async def publish(actor: Actor, args, transport, last: bool) -> dict:
    from agentrl.client.remote_engine import RemoteEngine
    from agentrl.trainer.publish import WeightPublisher

    events: list[str] = []

    async def hook(name):
        events.append(name)

    engine = RemoteEngine(args.publish, version=actor.version - 1) if dist.get_rank() == 0 else None
    try:
        publisher = WeightPublisher(transport, engine, before_pause=lambda: hook("before_pause"),
                                    after_resume=lambda: hook("after_resume"))
        record = await publisher.apublish(actor.model, actor.version)
        if last and engine is not None:
            await transport.close(engine)
    finally:
        if engine is not None:
            await engine.aclose()
    return {"path": record.path, "version": record.version, "events": events, "paused_s": record.paused_s,
            "deliver_s": record.deliver_s, "staging": getattr(transport, "staging", None),
            "client_version": engine.version if engine is not None else None}


def make_transport(args):
    from agentrl.trainer.publish import DiskTransport, DistributedTransport

    if args.transport == "distributed":  # small buckets: one update is several requests
        return DistributedTransport(master_address="127.0.0.1", backend="gloo", bucket_bytes=256 << 10, timeout_s=60)
    return DiskTransport(args.publish_root, source_dir=args.model_dir, keep_last=1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model_dir")
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--save-after", nargs=2, metavar=("STEP", "DIR"))
    p.add_argument("--restore")
    p.add_argument("--export")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--publish")
    p.add_argument("--publish-root")
    p.add_argument("--transport", choices=("disk", "distributed"), default="disk")
    p.add_argument("--kill-after-save", action="store_true")
    p.add_argument("--critic", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)

    gae = dict(advantages=AdvantageConfig(kind="gae", lam=0.95), critic=CriticConfig(lr=1e-3)) if args.critic else {}
    config = TrainerConfig(lr=args.lr, warmup_steps=1, total_steps=10, num_mini_batches=2,
                           micro_batch_tokens=40, loss=LossConfig(kind="decoupled_ppo", eps_high=0.28), **gae)
    actor = Actor(args.model_dir, config)
    critic = None
    if args.critic:
        from agentrl.trainer.critic import Critic

        critic = Critic(actor, config)
    if args.restore:
        load_checkpoint(actor, args.restore)
        if critic is not None:
            load_checkpoint(critic, args.restore + "-critic")  # type: ignore[arg-type]  # the actor's surface
    result: dict = {"stats": [], "world_size": dist.get_world_size(), "publish": []}
    first = actor.version
    transport = make_transport(args) if args.publish else None
    for _ in range(args.steps):
        step = actor.version
        # only rank 0 has the data, as in a real run (the rollout side lives there)
        trajs = make_trajectories(step, max(0, step - 1)) if dist.get_rank() == 0 else None
        batch = prepare_batch(broadcast_trajectories(trajs), version=step, config=config)
        values = critic.assign_advantages(batch) if critic is not None else {}  # as agentrl.run.loop does
        result["stats"].append({**values, **actor.train_step(batch), **(critic.train_step(batch) if critic else {})})
        if step == first:
            result["weights_after_first"] = full_weights(actor)
            if critic is not None:
                result["critic_after_first"] = full_weights(critic)
        if args.save_after and actor.version == int(args.save_after[0]):
            save_checkpoint(actor, args.save_after[1])
            if critic is not None:
                save_checkpoint(critic, args.save_after[1] + "-critic")  # type: ignore[arg-type]
            if args.kill_after_save:
                if dist.get_rank() == 0:
                    torch.save(result, args.out)
                dist.barrier()
                os.kill(os.getpid(), signal.SIGKILL)
        if args.publish:
            last = actor.version == first + args.steps
            result["publish"].append(asyncio.run(publish(actor, args, transport, last)))
    result["weights_final"] = full_weights(actor)
    if critic is not None:
        result["critic_final"] = full_weights(critic)
    if args.export:
        export_hf(actor.model, args.export, source_dir=args.model_dir)
    if dist.get_rank() == 0:
        torch.save(result, args.out)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()

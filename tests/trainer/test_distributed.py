"""Real torchrun runs of the FSDP2 actor on CPU (gloo): rank invariance, checkpoint resume, HF export.

Three short launches share one module fixture: 2 ranks (two steps uninterrupted, HF export);
1 rank (one step, checkpoint, then SIGKILL of the process); 2 fresh ranks restoring that
checkpoint (resharded from 1 to 2 ranks) and running the second step. Each trains a critic
beside the actor (``advantages.kind: gae``, ``agentrl.trainer.critic``), so the value model's
sharding, its per-rank GAE and its checkpoint go through the same three launches.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentrl.process.services import free_port

WORKER = Path(__file__).with_name("dist_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def torchrun(nproc: int, *args: str, killed: bool = False) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           f"--master_port={free_port()}", "--master_addr=127.0.0.1", str(WORKER), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    if killed:  # the workers were SIGKILLed on purpose; torchrun reports it
        assert proc.returncode != 0 and "Signal 9" in proc.stderr + proc.stdout, proc.stderr[-3000:]
        return
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


@pytest.fixture(scope="module")
def runs(untrained_model_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("dist")
    ckpt, export = d / "ckpt", d / "export"
    torchrun(2, str(untrained_model_dir), str(d / "two.pt"), "--steps", "2", "--export", str(export), "--critic")
    torchrun(1, str(untrained_model_dir), str(d / "one.pt"), "--steps", "2",
             "--save-after", "1", str(ckpt), "--kill-after-save", "--critic", killed=True)
    torchrun(2, str(untrained_model_dir), str(d / "resumed.pt"), "--steps", "1", "--restore", str(ckpt), "--critic")
    load = lambda name: torch.load(d / name, weights_only=False)  # noqa: E731
    return {"two": load("two.pt"), "one": load("one.pt"), "resumed": load("resumed.pt"),
            "ckpt": ckpt, "export": export, "model_dir": untrained_model_dir}


def _flat(sd: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([sd[k].reshape(-1).double() for k in sorted(sd)])


def test_two_ranks_match_one_rank(runs):
    one, two = runs["one"], runs["two"]
    assert (one["world_size"], two["world_size"]) == (1, 2)
    s1, s2 = one["stats"][0], two["stats"][0]
    assert s1["optimizer_steps"] == s2["optimizer_steps"] == 2  # two mini-batches
    assert s1["loss"] == pytest.approx(s2["loss"], rel=1e-5)
    assert s1["grad_norm"] == pytest.approx(s2["grad_norm"], rel=1e-5)
    w1, w2 = _flat(one["weights_after_first"]), _flat(two["weights_after_first"])
    assert ((w1 - w2).norm() / w1.norm()).item() < 1e-5
    # per tensor too, except the k_proj biases: their gradient is 0 analytically (softmax ignores
    # a per-query constant), so Adam turns float noise into steps; those must stay << lr (1e-4)
    for k, a in one["weights_after_first"].items():
        b = two["weights_after_first"][k]
        if k.endswith("k_proj.bias"):
            assert (a - b).abs().max().item() < 1e-6, k
        else:
            assert ((a - b).norm() / a.norm()).item() < 1e-5, k
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=k)


CRITIC_STATS = ("critic/value_before_mean", "critic/adv_mean", "critic/adv_std", "critic/value_loss",
                "critic/return_mean")


def test_a_critic_on_two_ranks_matches_one_rank(runs):
    """advantages.kind gae: the value model is sharded like the actor, each rank computes V and GAE
    for the sequences it trains and scales its value loss by the world size, so two ranks take one
    rank's step: the same values, advantages and value loss, the same value model after it."""
    s1, s2 = runs["one"]["stats"][0], runs["two"]["stats"][0]
    assert s1["critic/optimizer_steps"] == s2["critic/optimizer_steps"] == 2  # one value step per mini-batch
    for key in CRITIC_STATS:
        assert s1[key] == pytest.approx(s2[key], rel=1e-5, abs=1e-7), key
    assert s1["critic/value_loss"] > 0 and s1["critic/adv_std"] > 0
    w1, w2 = _flat(runs["one"]["critic_after_first"]), _flat(runs["two"]["critic_after_first"])
    assert ((w1 - w2).norm() / w1.norm()).item() < 1e-5
    moved = _flat(runs["two"]["critic_final"])  # and the second step moved it again
    assert ((moved - w2).norm() / w2.norm()).item() > 1e-4


def test_the_step_really_moved_the_weights(runs, untrained_model_dir):
    from safetensors.torch import load_file

    init = load_file(str(Path(untrained_model_dir) / "model.safetensors"))
    after = {k: v for k, v in runs["one"]["weights_after_first"].items() if k in init}
    w0, w1 = _flat({k: init[k] for k in after}), _flat(after)
    assert ((w1 - w0).norm() / w0.norm()).item() > 1e-3  # 100x the tolerance above


def test_resume_after_kill_gives_the_uninterrupted_next_step(runs):
    assert len(runs["one"]["stats"]) == 1  # the 1-rank run died right after its checkpoint
    uninterrupted, resumed = runs["two"]["stats"][1], runs["resumed"]["stats"][0]
    assert resumed["version"] == uninterrupted["version"] == 2
    assert resumed["optimizer_steps"] == uninterrupted["optimizer_steps"] == 4
    assert resumed["loss"] == pytest.approx(uninterrupted["loss"], rel=1e-5)
    assert resumed["lr"] == pytest.approx(uninterrupted["lr"], rel=1e-9)  # scheduler restored
    assert resumed["loss"] != pytest.approx(runs["two"]["stats"][0]["loss"], rel=1e-3)
    # Adam's moments came back too: a fresh optimizer would take a different second step
    final_two, final_resumed = runs["two"]["weights_final"], runs["resumed"]["weights_final"]
    w2, wr = _flat(final_two), _flat(final_resumed)
    assert ((w2 - wr).norm() / w2.norm()).item() < 1e-5
    for k, v in final_two.items():
        torch.testing.assert_close(final_resumed[k], v, rtol=1e-5, atol=1e-6, msg=k)
    # the critic came back from its own checkpoint (saved on 1 rank, resharded to 2) with its AdamW
    assert resumed["critic/optimizer_steps"] == uninterrupted["critic/optimizer_steps"] == 4
    for key in CRITIC_STATS:
        assert resumed[key] == pytest.approx(uninterrupted[key], rel=1e-5, abs=1e-7), key
    c2, cr = _flat(runs["two"]["critic_final"]), _flat(runs["resumed"]["critic_final"])
    assert ((c2 - cr).norm() / c2.norm()).item() < 1e-5


def test_hf_export_loads_with_transformers(runs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert "segments" not in (runs["export"] / "config.json").read_text()  # loads anywhere
    model = AutoModelForCausalLM.from_pretrained(str(runs["export"]), dtype=torch.float32)
    trained = runs["two"]["weights_final"]
    sd = model.state_dict()
    for k, v in trained.items():
        torch.testing.assert_close(sd[k], v, rtol=0, atol=0, msg=k)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    tok = AutoTokenizer.from_pretrained(str(runs["export"]))
    assert tok("hi")["input_ids"] == AutoTokenizer.from_pretrained(str(runs["model_dir"]))("hi")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert torch.isfinite(logits).all()


def test_incomplete_checkpoint_is_refused(tmp_path):
    from agentrl.errors import CheckpointError
    from agentrl.trainer.checkpoint import load_checkpoint

    (tmp_path / "half.tmp").mkdir()
    with pytest.raises(CheckpointError, match="interrupted"):
        load_checkpoint(object(), tmp_path / "half")  # type: ignore[arg-type]


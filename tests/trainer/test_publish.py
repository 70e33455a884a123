"""Weight publishing end to end: a 2-rank torchrun trainer publishes to a real `agentrl serve`."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest
import torch

from agentrl.api import SamplingParams
from agentrl.client.remote_engine import RemoteEngine
from agentrl.trainer.publish import (
    AdapterBroadcastTarget,
    AdapterTarget,
    BucketTarget,
    DiskTransport,
    PublishTarget,
    WeightGroupTarget,
    WeightUpdateTarget,
)

from .test_distributed import torchrun


def test_remote_engine_is_a_weight_update_target():
    """... and every narrower target a transport types its calls against (issue 43 split the one
    twelve-method BroadcastTarget into the parts DistributedTransport's steps use)."""
    engine = RemoteEngine("http://127.0.0.1:9")
    for target in (WeightUpdateTarget, AdapterTarget, WeightGroupTarget, BucketTarget, AdapterBroadcastTarget,
                   PublishTarget):
        assert isinstance(engine, target), target


def test_keep_last_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="keep_last"):
        DiskTransport(tmp_path, source_dir=tmp_path, keep_last=0)


def _teacher_forced(model_dir, ids):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logp = model(input_ids=torch.tensor([ids])).logits[0, :-1].log_softmax(-1)
    return logp.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_publish_round_trip_changes_the_served_weights_and_version(serve, untrained_model_dir, tmp_path):
    root = tmp_path / "published"
    torchrun(2, str(untrained_model_dir), str(tmp_path / "out.pt"), "--steps", "2", "--lr", "1e-2",
             "--publish", serve, "--publish-root", str(root))
    out = torch.load(tmp_path / "out.pt", weights_only=False)
    pubs = out["publish"]
    assert [p["client_version"] for p in pubs] == [1, 2]
    assert all(p["events"] == ["before_pause", "after_resume"] for p in pubs)
    assert [p.name for p in root.iterdir()] == ["v000002"]  # keep_last=1 pruned v1

    info = httpx.get(serve + "/model_info", timeout=30).json()
    assert info["weight_version"] == "2" and info["model_path"] == str(root / "v000002")

    ids, served = _served_sample(serve, version=2)
    new = _teacher_forced(root / "v000002", ids)[3:]
    old = _teacher_forced(untrained_model_dir, ids)[3:]
    torch.testing.assert_close(served, new, rtol=0, atol=1e-4)  # the server runs the published weights
    assert (served - old).abs().max().item() > 1e-2  # ... which are not the initial ones


def _served_sample(serve: str, version: int) -> tuple[list[int], torch.Tensor]:
    """A seeded 8-token sample from the server, which must carry ``version`` on every token: the
    prompt + sample ids and the server's log-probabilities of the sample."""
    async def sample():
        async with RemoteEngine(serve, version=version) as engine:
            return await engine.generate([1, 2, 3, 4], SamplingParams(max_new_tokens=8, temperature=1.0, seed=3))

    c = asyncio.run(sample())
    assert c.versions == [version] * len(c.tokens)
    assert all(math.isfinite(x) for x in c.logprobs)
    return [1, 2, 3, 4, *c.tokens], torch.tensor(c.logprobs)


def _teacher_forced_weights(model_dir, weights, ids):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    model.load_state_dict(weights)
    with torch.no_grad():
        logp = model(input_ids=torch.tensor([ids])).logits[0, :-1].log_softmax(-1)
    return logp.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_publish_by_broadcast_serves_the_trained_weights(serve, untrained_model_dir, tmp_path):
    """The distributed transport: 2 FSDP ranks gather to rank 0, which broadcasts to the server over
    a gloo group of their own, in several buckets, while the server generates (agentrl serve
    stages them; the pause only commits them); no file is written."""
    root = tmp_path / "published"
    torchrun(2, str(untrained_model_dir), str(tmp_path / "out.pt"), "--steps", "2", "--lr", "1e-2",
             "--publish", serve, "--publish-root", str(root), "--transport", "distributed")
    out = torch.load(tmp_path / "out.pt", weights_only=False)
    pubs = out["publish"]
    assert [p["client_version"] for p in pubs] == [1, 2]
    assert all(p["events"] == ["before_pause", "after_resume"] for p in pubs)
    assert all(p["path"].startswith("broadcast: ") and "bucket(s)" in p["path"] for p in pubs)
    assert int(pubs[0]["path"].split(", ")[-1].split()[0]) > 1  # 256 KiB buckets: several requests
    assert all(p["staging"] is True for p in pubs)  # overlapped: the buckets went before the pause
    assert not root.exists()

    info = httpx.get(serve + "/model_info", timeout=30).json()
    assert info["weight_version"] == "2"

    ids, served = _served_sample(serve, version=2)
    new = _teacher_forced_weights(untrained_model_dir, out["weights_final"], ids)[3:]
    old = _teacher_forced(untrained_model_dir, ids)[3:]
    torch.testing.assert_close(served, new, rtol=0, atol=1e-4)  # the server runs the trained weights
    assert (served - old).abs().max().item() > 1e-2

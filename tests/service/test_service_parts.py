"""The service's parts on their own: the learner's adapters, the state's TTL and paths, the wire codec.

The bug stories: a refused datum that leaves half a gradient in the client's adapter (its next
step would apply it); one client's optimizer step moving another's adapter; a freed client that
takes the others down with it; a session that vanished but keeps its adapter forever; a
checkpoint path that walks out of the service's directory; a protobuf field read from the wrong
number.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from agentrl.errors import Refused
from agentrl.service.learner import Learner, LoraSettings
from agentrl.service.proto import (
    Datum,
    ForwardBackward,
    fields,
    forward_backward_output,
    put,
    read_forward_backward,
    read_tensor,
)
from agentrl.service.registry import ServiceState

SEQ = [40, 41, 42, 43, 44, 45, 46, 47]


def sft(model_id: str, seq=SEQ, **change) -> ForwardBackward:
    inputs = {"target_tokens": np.array(seq[1:], dtype=np.int64), "weights": np.ones(len(seq) - 1, np.float32)}
    inputs.update(change)
    return ForwardBackward(model_id, 1, [Datum(seq[:-1], inputs)], "cross_entropy", {}, forward_only=False)


@pytest.fixture(scope="module")
def learner(tiny_model_dir):
    return Learner(tiny_model_dir)


def lora_tensors(learner: Learner, model_id: str) -> list[torch.Tensor]:
    return [p.detach().clone() for p in learner._params(model_id)]


ADAM = {"learning_rate": 0.05, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0, "grad_clip_norm": 1.0}


def test_clients_train_their_own_adapters_and_a_refused_datum_leaves_nothing(learner, tmp_path):
    learner.create("a", LoraSettings(rank=4, seed=1))
    learner.create("b", LoraSettings(rank=2, seed=2, train_mlp=False))
    b_before = lora_tensors(learner, "b")
    with pytest.raises(Refused, match=r"loss_fn_inputs\['weights'\] of shape \(7,\)"):
        learner.forward_backward(sft("a", weights=np.ones(3, np.float32)))
    assert all(p.grad is None for p in learner._params("a"))  # refused before any forward pass
    with pytest.raises(Refused, match="token ids in"):
        learner.forward_backward(sft("a", seq=[1, 2, 9999]))
    rl = {"logprobs": np.zeros(7, np.float32), "advantages": np.ones(7, np.float32)}
    for loss, config, why in (("stable_reinforce", {}, "objective is not published"),
                              ("dro", {}, r"needs a number in loss_fn_config\['beta'\]")):
        fb = sft("a", **rl)
        fb.loss_fn, fb.loss_fn_config = loss, config
        with pytest.raises(Refused, match=why):
            learner.forward_backward(fb)
    out, metrics = learner.forward_backward(sft("a"))
    assert out[0]["logprobs"].shape == (7,) and metrics["loss:sum"] == pytest.approx(-out[0]["logprobs"].sum(), rel=1e-5)
    learner.optim_step("a", ADAM)
    assert all(torch.equal(x, y) for x, y in zip(b_before, lora_tensors(learner, "b"), strict=True))
    assert learner.forward_backward(sft("a"))[1]["loss:sum"] < metrics["loss:sum"]
    learner.optim_step("a", ADAM)
    # export writes what agentrl serve loads: peft's two files, the base named, only this client's tensors
    out_dir = learner.export("a", tmp_path / "a")
    assert {p.name for p in out_dir.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}
    learner.drop("b")
    with pytest.raises(Refused, match="no training client 'b'"):
        learner.forward_backward(sft("b"))
    assert learner.forward_backward(sft("a"))[1]["loss:sum"] > 0  # the other client goes on
    learner.optim_step("a", {**ADAM, "learning_rate": 0.0})


def test_a_saved_state_loads_only_into_a_client_of_its_shape(learner, tmp_path):
    learner.create("c", LoraSettings(rank=4, seed=3))
    learner.save_state("c", tmp_path / "state")
    learner.create("d", LoraSettings(rank=8, seed=4))
    with pytest.raises(Refused, match="rank 4"):
        learner.load_state("d", tmp_path / "state", optimizer=True)
    learner.export("c", tmp_path / "sampler")
    with pytest.raises(Refused, match="holds no optimizer state"):
        learner.load_state("c", tmp_path / "sampler", optimizer=True)


def test_sessions_past_their_ttl_are_removed_with_their_clients(tmp_path):
    state = ServiceState(tmp_path, "base", ttl_s=60)
    old, fresh = state.new_session(), state.new_session()
    state.models["m"] = old
    state.sessions[old].models.add("m")
    state.sessions[old].last_seen = time.monotonic() - 61
    gone = state.expired()
    assert [s.session_id for s in gone] == [old] and "m" not in state.models and fresh in state.sessions
    with pytest.raises(Refused, match="no session"):
        state.session(old)


async def test_an_expired_sessions_adapters_are_freed_by_a_queued_job(learner, tmp_path):
    from agentrl.service.futures import Futures
    from agentrl.service.routes import Service, free

    state = ServiceState(tmp_path, "base", ttl_s=60)
    service = Service(state=state, learner=learner, sampler=None, futures=Futures(), key="tml-x")
    sid = state.new_session()
    learner.create("gone", LoraSettings(rank=2, seed=5))
    state.models["gone"] = sid
    state.sessions[sid].models.add("gone")
    state.sessions[sid].last_seen = time.monotonic() - 61
    free(service, state.expired())
    done = service.futures.submit(lambda: "after the drop")  # the queue runs in order
    assert await service.futures.wait(done, 30) == "after the drop"
    assert "gone" not in learner.names and "gone" not in learner.optimizers
    await service.futures.close()


def test_checkpoint_paths_stay_inside_the_service_directory(tmp_path):
    state = ServiceState(tmp_path, "base")
    path, directory = state.checkpoint("s1:train:0", "weights", "step-1")
    assert path == "tinker://s1:train:0/weights/step-1" and directory.is_relative_to(tmp_path)
    for name in ("../x", ".hidden", "a/b", ""):
        if name:
            with pytest.raises(Refused, match="checkpoint name"):
                state.checkpoint("s1:train:0", "weights", name)
    for bad in ("tinker://s1:train:0/weights/..", "tinker://../weights/x", "tinker://s1/other/x", "file:///etc"):
        with pytest.raises(Refused):
            state.resolve(bad)
    directory.mkdir(parents=True)
    assert state.resolve(path) == directory


def test_the_wire_codec_reads_what_it_is_sent_and_writes_batched_outputs():
    # an int64 Tensor (dtype 2) of shape [3] (packed varints)
    tensor = put(1, np.arange(3, dtype=np.int64).tobytes()) + put(3, 2) + put(4, bytes([3]))
    assert read_tensor(tensor).tolist() == [0, 1, 2]
    chunk = put(1, put(1, np.array([5, 6, 7], np.int32).tobytes()))
    datum = put(1, chunk) + put(2, put(1, "target_tokens") + put(2, tensor))
    body = (put(1, "m:train:0") + put(2, 3) + put(3, datum) + put(4, "ppo")
            + put(7, put(1, "clip_low_threshold") + put(2, put(1, 0.7))) + put(6, 1))
    fb = read_forward_backward(body)
    assert (fb.model_id, fb.seq_id, fb.loss_fn, fb.forward_only) == ("m:train:0", 3, "ppo", True)
    assert fb.data[0].tokens == [5, 6, 7] and fb.data[0].inputs["target_tokens"].tolist() == [0, 1, 2]
    assert fb.loss_fn_config == {"clip_low_threshold": 0.7}
    out = fields(forward_backward_output([{"logprobs": np.array([-1.0, -2.0])}, {"logprobs": np.array([-3.0])}],
                                         {"loss:sum": 6.0}))
    record = fields(out[2][0])
    batched = fields(fields(record[2][0])[2][0])
    assert np.frombuffer(batched[1][0], np.float32).tolist() == [-1.0, -2.0, -3.0]
    assert np.frombuffer(batched[2][0], np.int64).tolist() == [0, 8, 12] and record[3] == [2]
    with pytest.raises(Refused, match="malformed"):
        read_forward_backward(b"\x0a\xff\xff")

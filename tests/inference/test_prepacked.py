"""Prepacked projections (``agentrl.inference.prepacked``, issue 50): a decoder multiplying by
oneDNN-packed copies of its weights computes what one on the plain weights computes, after every
kind of weight update — right after the swap (the copies still being made) and once they are
made — so a served model never multiplies by packed copies of replaced weights."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from agentrl.inference import prepacked
from agentrl.inference.decoder import Decoder, Step
from agentrl.inference.prepacked import PACKED, available

pytestmark = pytest.mark.skipif(not available(torch.device("cpu"), torch.float32),
                                reason="this torch has no oneDNN: nothing is prepacked")


def logits(dec: Decoder) -> torch.Tensor:
    """A prefill of two prompts, then a decode step of both: every projection, both kernels' shapes."""
    first = dec.forward(Step([], [(0, 0, [5, 6, 7, 8, 9, 10, 11]), (1, 0, [12, 13, 14])]))
    nxt = dec.forward(Step([(20, 7), (21, 3)], []))
    return torch.cat([first, nxt])


def check_same(packed: Decoder, plain: Decoder, before: torch.Tensor | None) -> torch.Tensor:
    """Both decoders' logits agree now, and again once the packed copies are made; the plain one's."""
    torch.testing.assert_close(logits(packed), logits(plain), rtol=0, atol=1e-4)
    assert packed.wait_packed(60)
    ours, theirs = logits(packed), logits(plain)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))  # the same greedy tokens
    assert before is None or (theirs - before).abs().max() > 1e-2  # the update changed what is served
    return theirs


def broadcast(dec: Decoder, tensors: list[tuple[str, torch.Tensor]]) -> dict:
    """A staging copy received as ``weight_sync`` receives a broadcast: into the decoder's buffers
    (spares of replaced weights), written the way a collective writes — bumping no version counter."""
    targets, fresh = dec.receive_targets([(n, t.dtype, tuple(t.shape)) for n, t in tensors])
    for target, (_, t) in zip(targets, tensors, strict=True):
        target.numpy()[...] = t.numpy()
    return dec.prepare_tensors([(n, t) for (n, _), t in zip(tensors, targets, strict=True)], "test", fresh)


def test_after_each_kind_of_update_the_packed_decoder_serves_what_the_plain_one_does(
        untrained_model_dir, second_model_dir, random_adapter, tmp_path, monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.setattr(prepacked, "MIN_WORK", 0)  # every product by the packed copies, however small
    packed, plain = (Decoder(untrained_model_dir, num_slots=2, max_len=32, prepack=p) for p in (True, False))
    assert packed.prepack and not plain.prepack
    assert packed.memory_bytes()["prepacked"] > 0 and plain.memory_bytes()["prepacked"] == 0
    assert not Decoder(untrained_model_dir, num_slots=1, max_len=8, batch_invariant=True).prepack
    seen = check_same(packed, plain, None)

    def update(make) -> None:
        nonlocal seen
        for dec in (packed, plain):
            dec.swap_weights(make(dec))
        seen = check_same(packed, plain, seen)

    update(lambda dec: dec.prepare_weights(second_model_dir))  # from disk
    lm_head = packed.weights[PACKED].lm_head
    adapter = random_adapter(untrained_model_dir, tmp_path / "adapter")
    update(lambda dec: dec.prepare_weights(adapter))  # a LoRA adapter merged in
    assert packed.weights[PACKED].lm_head is lm_head  # the output layer, not merged on, kept its copy
    assert PACKED not in packed.base  # the base only merged on holds none

    tensors = sorted(load_file(untrained_model_dir / "model.safetensors").items())
    layer0 = [(n, t) for n, t in tensors if ".layers.0." in n]
    update(lambda dec: dec.prepare_tensors(layer0, "test"))  # some tensors, as a broadcast sends them

    def buckets(dec: Decoder) -> dict:  # buckets staged one over another (written in place), then swapped
        half = len(tensors) // 2
        staged = dec.prepare_tensors(tensors[:half], "test")
        return dec.prepare_tensors(tensors[half:], "test", onto=staged)
    update(buckets)

    # two broadcasts, no step between their swaps (the copies of the first never made): the second
    # lands in the tensors the one before them left — copies of their old values must not serve
    second = sorted(load_file(second_model_dir / "model.safetensors").items())
    update(lambda dec: (dec.swap_weights(broadcast(dec, second)), broadcast(dec, second))[1])

    for dec in (packed, plain):  # written in place under the served weights: not multiplied by until remade
        dec.weights["layers"][1]["gate_up"].mul_(1.5)
        dec.weights["lm_head"].mul_(0.5)
    seen = check_same(packed, plain, seen)

    packed.release_spares()  # colocated training's "weights" release frees the packed copies too
    assert packed.memory_bytes()["prepacked"] == 0
    torch.testing.assert_close(logits(packed), seen, rtol=0, atol=1e-4)  # the plain weights serve
    assert packed.wait_packed(60)  # and the copies are made again


def test_the_serve_flag_turns_prepacking_off():
    from agentrl.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["serve", "--model", "m"]).prepack_weights is True
    assert parser.parse_args(["serve", "--model", "m", "--no-prepack-weights"]).prepack_weights is False

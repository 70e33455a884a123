"""The engine's own forward pass and sampler, against transformers on hand-made inputs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from agentrl.errors import ModelError
from agentrl.inference import decoder as decoder_module
from agentrl.inference.decoder import Decoder, Step
from agentrl.inference.sampling import sample_rows


def make_checkpoint(kind: str, path):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    common = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
    if kind == "llama":
        config = LlamaConfig(**common, tie_word_embeddings=False,
                             rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 16})
    else:
        config = Qwen3Config(**common, head_dim=16, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(str(path))
    return model


@pytest.mark.parametrize("per_row", [True, False], ids=["matmul-per-row", "matmul-per-key-head"])
@pytest.mark.parametrize("kind", ["qwen2", "llama", "qwen3"])
def test_packed_prefill_and_decode_in_any_slots_equal_transformers(kind, per_row, tmp_path, untrained_model_dir,
                                                                   monkeypatch):
    torch.set_num_threads(1)
    if not per_row:  # the decode attention for long keys
        monkeypatch.setattr(decoder_module, "ROW_ATTENTION_MAX", 0)
    if kind == "qwen2":
        from transformers import AutoModelForCausalLM

        path, hf = untrained_model_dir, AutoModelForCausalLM.from_pretrained(untrained_model_dir).eval()
    else:
        path, hf = tmp_path, make_checkpoint(kind, tmp_path)
    dec = Decoder(path, num_slots=6, max_len=32)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 60, (n,), generator=g).tolist() for n in (5, 9, 3)]
    slots = [4, 1, 2]
    # three prompts of different lengths packed into one forward, no padding
    last = dec.forward(Step([], [(slot, 0, x) for slot, x in zip(slots, seqs, strict=True)]))
    nxt = torch.randint(0, 60, (3,), generator=g).tolist()
    # one decode token per slot: slots 0 and 3 are fillers
    rows: list = [None] * 5
    for slot, x, t in zip(slots, seqs, nxt, strict=True):
        rows[slot] = (t, len(x))
    step = dec.forward(Step(rows, []))
    with torch.no_grad():
        for i, x in enumerate(seqs):
            ref = hf(torch.tensor([x + [nxt[i]]])).logits[0]
            assert torch.allclose(last[i], ref[len(x) - 1], atol=1e-4)
            assert torch.allclose(step[slots[i]], ref[-1], atol=1e-4)


def test_a_step_mixing_decode_rows_and_prompts_equals_separate_steps(untrained_model_dir):
    """Merging a prefill into a decode step, and starting a prompt from a prefix copied out
    of the pool, change no logit (beyond float rounding)."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(2)
    a, b, c = (torch.randint(0, 250, (n,), generator=g).tolist() for n in (7, 11, 6))
    shared = b[:8]

    def run(merged: bool) -> list[torch.Tensor]:
        dec = Decoder(untrained_model_dir, num_slots=4, max_len=32, pool_tokens=16)
        dec.forward(Step([], [(0, 0, a)]))  # slot 0 is decoding a
        dec.forward(Step([], [(3, 0, b)]))  # slot 3 computed b: keep its first 8 tokens in the pool
        dec.save_prefixes({e: (3, e) for e in range(8)})
        dec.load_prefixes([(2, list(range(8)))])  # slot 2 starts from b's prefix, computes the rest of c'
        c2 = shared + c
        decode = (a[-1] + 1) % 250, len(a)
        if merged:
            out = dec.forward(Step([decode], [(2, 8, c2[8:]), (1, 0, c)]))
            return [out[0], out[1], out[2]]
        one = dec.forward(Step([decode], []))
        two = dec.forward(Step([], [(2, 8, c2[8:])]))
        three = dec.forward(Step([], [(1, 0, c)]))
        return [one[0], two[0], three[0]]

    merged, separate = run(True), run(False)
    for m, s in zip(merged, separate, strict=True):
        assert torch.allclose(m, s, atol=1e-5)
    # and the prefix-cached prompt equals computing shared + c from scratch
    dec = Decoder(untrained_model_dir, num_slots=1, max_len=32)
    assert torch.allclose(dec.forward(Step([], [(0, 0, shared + c)]))[0], merged[1], atol=1e-5)


def test_unsupported_architectures_are_refused_by_name(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ModelError, match="model_type 'gpt2' .* not supported .*llama, qwen2, qwen3"):
        Decoder(tmp_path, num_slots=1, max_len=8)
    with pytest.raises(ModelError, match="no config.json"):
        Decoder(tmp_path / "missing", num_slots=1, max_len=8)


def test_sampler_pinned_numbers():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]] * 4)
    temperature = torch.tensor([0.0, 1.0, 0.5, 1.0])
    top_k = torch.tensor([-1, 2, -1, -1])
    top_p = torch.tensor([1.0, 1.0, 1.0, 0.7])
    uniform = torch.tensor([0.99, 0.99, 0.5, 0.99])
    tokens, logprobs, top = sample_rows(logits, temperature, top_k, top_p, uniform, top_n=2)
    p = torch.softmax(logits[0], -1)
    # greedy: argmax, a point mass
    assert tokens[0] == 0 and logprobs[0] == 0.0
    # top-k 2: {0, 1} renormalized; u=0.99 picks the less likely one
    assert tokens[1] == 1 and math.isclose(logprobs[1], math.log(p[1] / (p[0] + p[1])), rel_tol=1e-5)
    # temperature 0.5 sharpens: p0 = e^4 / (e^4 + e^2 + 1 + e^-2) = 0.8650, so u=0.5 picks 0
    assert tokens[2] == 0 and math.isclose(logprobs[2], -0.14508, abs_tol=1e-4)
    # top-p 0.7: p0 = 0.6439 < 0.7, so {0, 1} are kept
    assert tokens[3] == 1 and math.isclose(logprobs[3], math.log(p[1] / (p[0] + p[1])), rel_tol=1e-5)
    assert top[1][1].tolist() == [0, 1] and top[0][0, 1].item() == float("-inf")


def test_sampler_frequencies_follow_the_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).expand(20000, 3)
    n = logits.shape[0]
    ones = torch.ones(n)
    tokens, logprobs, _ = sample_rows(logits, ones, -ones.long(), ones, torch.rand(n, generator=torch.Generator().manual_seed(0)))
    freq = torch.bincount(tokens, minlength=3).float() / n
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.2]), atol=0.015)
    assert torch.allclose(logprobs, torch.log(torch.tensor([0.5, 0.3, 0.2]))[tokens], atol=1e-6)


def test_serve_refuses_an_unsupported_checkpoint_in_one_line(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    r = subprocess.run([str(Path(sys.executable).parent / "agentrl"), "serve", "--model", str(tmp_path), "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"agentrl serve: error: model_type 'gpt2' in {tmp_path}/config.json is not supported by the embedded "
        "engine (supported: llama, qwen2, qwen3); serve it with SGLang instead"]

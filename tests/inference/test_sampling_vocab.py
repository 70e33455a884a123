"""SGLang's whole sampling vocabulary on ``agentrl serve`` (issue 16): penalties, min-p, logit
bias, ``min_new_tokens``, ``stop_regex`` and prompt logprobs, with logprobs exact for the
distribution actually sampled from."""

from __future__ import annotations

import math
import re

import httpx
import pytest
import torch

from agentrl.inference.sampling import penalize, sample_rows

PROMPT = [60, 124, 117, 115, 101, 114, 124, 62, 72, 105, 33]


def generate(url: str, body: dict) -> dict | list:
    r = httpx.post(url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def hf_logits(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float()


# ---------------------------------------------------------------- pure functions, pinned numbers


def test_penalize_on_hand_made_logits():
    logits = torch.tensor([[2.0, -1.0, 0.5, 1.0]])
    counts = torch.tensor([[2.0, 1.0, 0.0, 0.0]])
    out = penalize(logits, counts, frequency=torch.tensor([0.5]), presence=torch.tensor([0.25]),
                   repetition=torch.tensor([2.0]), banned=torch.tensor([[False, False, False, True]]),
                   bias=torch.tensor([[0.0, 0.0, 1.5, 0.0]]))
    # token 0: 2 - 0.5*2 - 0.25 = 0.75, seen and positive -> / 2 = 0.375
    # token 1: -1 - 0.5 - 0.25 = -1.75, seen and negative -> * 2 = -3.5
    # token 2: unseen, + bias 1.5 = 2.0; token 3: banned
    assert out.tolist() == [[0.375, -3.5, 2.0, float("-inf")]]


def test_min_p_keeps_tokens_at_least_that_fraction_of_the_best_and_renormalizes():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    one = torch.ones(1)
    for u, token in ((0.0, 0), (0.7, 1), (0.999, 1)):
        tok, lp, _ = sample_rows(probs.log(), one, torch.tensor([-1]), one, torch.tensor([u]),
                                 min_p=torch.tensor([0.5]))  # keeps p >= 0.25: tokens 0 and 1
        assert tok.item() == token
        assert lp.item() == pytest.approx(math.log(probs[0, token].item() / 0.8), abs=1e-6)


def test_extreme_but_valid_settings_give_finite_logprobs_not_nan():
    """Found by the fuzz test (a 500: NaN is not JSON): a repetition penalty of 5e-324 (in
    (0, 2]) rounds to 0 in float32 and divides a seen logit to +inf, and a temperature of 1e300
    to inf, which turns a banned token's -inf into NaN; one NaN or +inf made its row all NaN."""
    logits = torch.tensor([[5.0, 0.0, -1.0, 1.0]])
    counts = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    zero = torch.zeros(1)
    for repetition in (5e-324, 1e-40):
        out = penalize(logits, counts, zero, zero, torch.tensor([repetition]),
                       banned=torch.tensor([[False, False, False, True]]))
        # token 0 overflows (kept at the largest float), 0 stays 0 (not 0/0), -1 * ~0, 3 banned
        assert out[0, 0].item() == torch.finfo(torch.float32).max and out[0, 1].item() == 0.0
        assert out[0, 3].item() == float("-inf") and not out.isnan().any()
        for temperature in (0.0, 1e-5, 1.0, 1e300):
            tok, lp, top = sample_rows(out, torch.tensor([temperature]), torch.tensor([-1]), torch.ones(1),
                                       torch.tensor([0.5]), top_n=4)
            assert math.isfinite(lp.item()) and not top[0].isnan().any(), (repetition, temperature)
            assert tok.item() != 3  # the banned token never comes
    tok, lp, _ = sample_rows(logits, torch.tensor([1e300]), torch.tensor([-1]), torch.ones(1), torch.tensor([0.1]))
    assert lp.item() == pytest.approx(math.log(1 / 4))  # a huge temperature: uniform, finite


# ---------------------------------------------------------------- over HTTP


def test_sglang_frontends_default_sampling_params_are_accepted(server):
    """What ``sglang.lang``'s RuntimeEndpoint sends for ``sgl.gen`` (every key, at its default)."""
    body = {"text": "Hello", "sampling_params": {
        "skip_special_tokens": True, "spaces_between_special_tokens": True, "max_new_tokens": 8,
        "min_new_tokens": 0, "n": 1, "stop": [], "stop_token_ids": [], "stop_regex": [], "temperature": 1.0,
        "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
        "ignore_eos": False, "regex": None, "json_schema": None}}
    out = generate(server, body)
    assert out["meta_info"]["finish_reason"]["type"] in ("stop", "length")


def test_penalised_logprobs_are_those_of_the_penalised_distribution(server, hf_model):
    sp = {"max_new_tokens": 24, "temperature": 0.8, "frequency_penalty": 1.5, "presence_penalty": 0.5,
          "repetition_penalty": 1.3, "min_p": 0.02, "logit_bias": {"101": 2.0}, "sampling_seed": 5, "ignore_eos": True}
    out = generate(server, {"input_ids": PROMPT, "sampling_params": sp, "return_logprob": True})
    triples = out["meta_info"]["output_token_logprobs"]
    tokens = [t[1] for t in triples]
    logits = hf_logits(hf_model, PROMPT + tokens)[len(PROMPT) - 1 : -1]
    V = logits.shape[1]
    bias = torch.zeros(1, V)
    bias[0, 101] = 2.0
    for i, (lp, tok, _) in enumerate(triples):
        counts = torch.bincount(torch.tensor(tokens[:i], dtype=torch.long), minlength=V).float()[None]
        row = penalize(logits[i : i + 1], counts, torch.tensor([1.5]), torch.tensor([0.5]), torch.tensor([1.3]),
                       bias=bias)[0] / 0.8
        probs = row.softmax(-1)
        kept = probs >= probs.max() * 0.02
        assert kept[tok]
        assert lp == pytest.approx(math.log(probs[tok].item() / probs[kept].sum().item()), abs=1e-4), i


def test_logit_bias_and_min_new_tokens_reshape_the_greedy_choice(server):
    sp = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    plain = generate(server, {"input_ids": PROMPT, "sampling_params": sp})["output_ids"]
    forced = generate(server, {"input_ids": PROMPT, "sampling_params": {**sp, "logit_bias": {"42": 100.0}}})
    assert forced["output_ids"] == [42] * 6
    # the greedy first token as a stop token ends the output at once, unless min_new_tokens forbids it
    stop = {"max_new_tokens": 6, "temperature": 0, "stop_token_ids": [plain[0]]}
    assert generate(server, {"input_ids": PROMPT, "sampling_params": stop})["output_ids"] == [plain[0]]
    held = generate(server, {"input_ids": PROMPT, "sampling_params": {**stop, "min_new_tokens": 3}})["output_ids"]
    assert len(held) >= 3 and plain[0] not in held[:3]


def test_stop_regex_ends_the_output_where_a_pattern_matches(server, tokenizer):
    sp = {"max_new_tokens": 30, "temperature": 0, "ignore_eos": True}
    full = generate(server, {"input_ids": PROMPT, "sampling_params": sp})
    text = tokenizer.decode(full["output_ids"], skip_special_tokens=True)
    pattern = re.escape(text[10:13]) + "$"  # a match that can only complete at one token
    out = generate(server, {"input_ids": PROMPT, "sampling_params": {**sp, "stop_regex": [pattern]}})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    n = len(out["output_ids"])
    assert out["output_ids"] == full["output_ids"][:n] and n < 30
    assert re.search(pattern, tokenizer.decode(out["output_ids"], skip_special_tokens=True))


@pytest.mark.parametrize("start", [0, 4])
def test_prompt_logprobs_equal_a_teacher_forced_pass_even_from_the_prefix_cache(server, hf_model, start):
    prompt = [*PROMPT, 70, 71, 72]
    generate(server, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}})  # now cached
    out = generate(server, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 2, "temperature": 0},
                            "return_logprob": True, "logprob_start_len": start, "top_logprobs_num": 3,
                            "return_text_in_logprobs": True})
    meta = out["meta_info"]
    got = meta["input_token_logprobs"]
    assert [t[1] for t in got] == prompt[start:] and got[0][0] is None
    assert all(isinstance(t[2], str) for t in got)
    ref = torch.log_softmax(hf_logits(hf_model, prompt), -1)
    want = [ref[i - 1, prompt[i]].item() for i in range(start + 1, len(prompt))]
    assert [t[0] for t in got[1:]] == pytest.approx(want, abs=1e-4)
    tops = meta["input_top_logprobs"]
    assert tops[0] is None and len(tops) == len(got)
    for i, row in zip(range(start + 1, len(prompt)), tops[1:], strict=True):
        best = ref[i - 1].topk(3)
        assert [t[1] for t in row] == best.indices.tolist()
        assert [t[0] for t in row] == pytest.approx(best.values.tolist(), abs=1e-4)
    assert len(meta["output_token_logprobs"]) == 2


def test_max_new_tokens_zero_scores_a_batch_of_texts_like_sgl_select(server, tokenizer):
    """``sgl.select`` sends ``max_new_tokens: 0`` with a batch of texts and reads input logprobs."""
    texts = ["The sky is blue", "The sky is green"]
    out = generate(server, {"text": texts, "sampling_params": {"max_new_tokens": 0, "temperature": 0},
                            "return_logprob": True, "return_text_in_logprobs": True, "logprob_start_len": 2})
    for text, r in zip(texts, out, strict=True):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert r["output_ids"] == [] and r["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
        lps = r["meta_info"]["input_token_logprobs"]
        assert [t[1] for t in lps] == ids[2:] and lps[0][0] is None
        assert all(t[0] < 0 for t in lps[1:])


def test_n_samples_share_the_prompt_and_each_report_its_prompt_logprobs(server):
    out = generate(server, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4, "n": 3},
                            "return_logprob": True, "logprob_start_len": 0})
    assert len(out) == 3
    first = out[0]["meta_info"]["input_token_logprobs"]
    assert len(first) == len(PROMPT) and all(o["meta_info"]["input_token_logprobs"] == first for o in out)

"""The tiny demo model: its training data, the `agentrl model` CLI, and the committed build."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.model.arith_data import CALCULATOR_TOOL, generate_problems, is_heldout
from agentrl.model.tinymodel import (
    TinyModelConfig,
    _arith_example,
    _is_tool_step,
    arith_messages,
    encode_with_mask,
    lr_at,
    sft_train,
    tool_messages,
    training_batch,
)
from agentrl.model.tokenizer import build_tokenizer, tool_call_text

# A build small enough for the test suite (seconds): the same code path as the real one.
SMALL = ["sft_steps=12", "schedule_steps=12", "hidden_size=32", "num_layers=2", "batch_size=16", "tool_batch_size=2",
         "tool_fraction=0.25", "eval_problems=20", "eval_sample=10", "eval_tool_problems=3", "threads=1"]


def agentrl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "agentrl", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


# --------------------------------------------------------------------------- data


def test_fast_arith_encoding_equals_the_chat_template(tok):
    for p in generate_problems(20, seed=0, num_terms=(2, 3), split="train"):
        assert _arith_example(p) == encode_with_mask(tok, arith_messages(p))


def test_loss_mask_covers_exactly_the_assistant_turns(tok):
    p = generate_problems(1, seed=0, split="train")[0]
    ids, mask = encode_with_mask(tok, tool_messages(p), [CALCULATOR_TOOL])
    taught = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
    call = tool_call_text("calculator", {"expression": p.expression})
    assert taught == f"{call}<|end|>\\boxed{{{p.answer}}}<|end|>"
    prompt = tok.decode(ids[: mask.index(1)])
    assert prompt.startswith("<|system|># Tools\n") and prompt.endswith(f"{p.question}<|end|><|assistant|>")


def test_tool_steps_are_spread_evenly():
    steps = [s for s in range(900) if _is_tool_step(s, 0.05)]
    assert len(steps) == 45 and steps[0] == 19 and all(b - a == 20 for a, b in zip(steps, steps[1:], strict=False))
    assert not any(_is_tool_step(s, 0.0) for s in range(100))
    assert all(_is_tool_step(s, 1.0) for s in range(100))


def test_training_batches_are_deterministic_and_never_hold_heldout_problems(tok):
    cfg = load_config(TinyModelConfig, None, ["batch_size=64", "tool_fraction=0.5", "tool_batch_size=4"])
    for step in range(4):
        ids, labels = training_batch(cfg, tok, step)
        again, _ = training_batch(cfg, tok, step)
        assert ids.equal(again)
        for row in tok.batch_decode(ids, skip_special_tokens=False):
            expression = row.split("What is ", 1)[1].split("?", 1)[0]
            assert not is_heldout(expression)
        assert (labels != -100).any(dim=1).all()  # every row teaches something
    arith, _ = training_batch(cfg, tok, 0)
    tools, _ = training_batch(cfg, tok, 1)
    assert arith.shape[0] == 64 and tools.shape[0] == 4


def test_lr_schedule_warms_up_then_decays_independently_of_the_stopping_step():
    cfg = load_config(TinyModelConfig, None, ["sft_steps=50", "schedule_steps=100", "warmup=0.1", "lr=1e-3"])
    longer = load_config(TinyModelConfig, None, ["sft_steps=100", "schedule_steps=100", "warmup=0.1", "lr=1e-3"])
    assert lr_at(cfg, 0) == pytest.approx(1e-4) and lr_at(cfg, 9) == pytest.approx(1e-3)
    assert lr_at(cfg, 100) == lr_at(cfg, 150) == pytest.approx(1e-4)  # ends at min_lr_ratio (0.1)
    assert 1e-4 < lr_at(cfg, 99) < lr_at(cfg, 50) < lr_at(cfg, 11) < lr_at(cfg, 10) == 1e-3
    assert all(lr_at(cfg, s) == lr_at(longer, s) for s in range(100))


def test_a_shorter_build_is_a_prefix_of_a_longer_one(tok):
    """What lets a build stop early: its weights are the longer run's weights at that step."""
    import torch

    small = [o for o in SMALL if not o.startswith("sft_steps")] + ["schedule_steps=12"]
    short, _ = sft_train(load_config(TinyModelConfig, None, small + ["sft_steps=6"]), tok, progress=False)
    seen = {}

    def keep(step, model):
        if step == 5:
            seen.update({k: v.detach().clone() for k, v in model.state_dict().items()})

    longer, _ = sft_train(load_config(TinyModelConfig, None, small + ["sft_steps=12"]), tok, progress=False,
                          on_step=keep)
    assert all(torch.equal(v, seen[k]) for k, v in short.state_dict().items())
    assert not all(torch.equal(v, seen[k]) for k, v in longer.state_dict().items())


def test_bad_hidden_size_names_the_key():
    from agentrl.errors import ConfigError

    with pytest.raises(ConfigError, match="'hidden_size'"):
        load_config(TinyModelConfig, None, ["hidden_size=60"])
    with pytest.raises(ConfigError, match="'sft_steps'.*schedule_steps"):
        load_config(TinyModelConfig, None, ["sft_steps=1000", "schedule_steps=900"])


# --------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize(
    "override, key, words",
    [
        ("sft_step=5", "sft_step", "did you mean 'sft_steps'"),
        ("lr=fast", "lr", "expected a number"),
        ("batch_size=2.5", "batch_size", "expected an integer"),
        ("tool_fraction=1.5", "tool_fraction", "<= 1"),
        ("warmup=-0.1", "warmup", ">= 0"),
        ("optimizer=sgd", "optimizer", "expected one of ['muon', 'adamw']"),
    ],
)
def test_bad_config_exits_nonzero_with_one_line_naming_the_key(tmp_path, override, key, words):
    res = agentrl("model", "tiny", "--out", str(tmp_path / "m"), override, timeout=60)
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert f"'{key}'" in lines[0] and words in lines[0]
    assert not (tmp_path / "m").exists()


def test_bad_config_file_key_is_named(tmp_path):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("sft_steps: 10\nnum_layer: 2\n")
    res = agentrl("model", "tiny", "--out", str(tmp_path / "m"), "--config", str(cfg), timeout=60)
    assert res.returncode != 0 and len(res.stderr.strip().splitlines()) == 1
    assert "'num_layer'" in res.stderr and "did you mean 'num_layers'" in res.stderr


def test_eval_of_a_missing_model_is_one_clear_line(tmp_path):
    res = agentrl("model", "eval", str(tmp_path), timeout=60)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "not a model directory" in res.stderr


@pytest.fixture(scope="module")
def small_builds(tmp_path_factory):
    """Three small builds through the real CLI: seed 0 twice, then seed 1."""
    root = tmp_path_factory.mktemp("tiny-builds")
    runs = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        res = agentrl("model", "tiny", "--out", str(root / name), "--no-progress", *SMALL, f"seed={seed}")
        assert res.returncode == 0, res.stderr
        runs[name] = (root / name, res.stdout)
    return runs


def test_build_prints_accuracy_and_loads_offline_and_generates(small_builds):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, stdout = small_builds["a"]
    assert "held-out a+b+c greedy accuracy" in stdout
    printed = json.loads(stdout.strip().splitlines()[-1])
    info = json.loads((out / "build_info.json").read_text())
    assert printed["accuracy"] == info["accuracy"] and 0.0 <= info["accuracy"] <= 1.0
    assert info["config"]["sft_steps"] == 12 and {"tool_call_rate", "sample_accuracy"} <= info.keys()
    assert (out / "build_config.yaml").is_file() and (out / "model.safetensors").is_file()

    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 1+2+3?"}],
                                     tokenize=True, add_generation_prompt=True)["input_ids"]
    gen = model.generate(torch.tensor([prompt]), max_new_tokens=5, do_sample=False)
    assert gen.shape[1] > len(prompt) and gen[0, : len(prompt)].tolist() == prompt


def test_same_seed_same_weights_other_seed_differs(small_builds):
    from safetensors.torch import load_file

    a, b, c = (load_file(str(small_builds[n][0] / "model.safetensors")) for n in "abc")
    assert a.keys() == b.keys() == c.keys()
    assert all(a[k].equal(b[k]) for k in a)
    assert not all(a[k].equal(c[k]) for k in a)


# --------------------------------------------------------------------------- the committed model


def test_committed_model_accuracy_is_in_the_demo_band(tiny_model_dir: Path):
    info = json.loads((tiny_model_dir / "build_info.json").read_text())
    assert info["eval_problems"] >= 1000
    assert 0.10 <= info["accuracy"] <= 0.60, info["accuracy"]
    assert info["config"] == TinyModelConfig().__dict__, "the committed model is not the default build"


def test_eval_reproduces_the_committed_figure(tiny_model_dir: Path):
    info = json.loads((tiny_model_dir / "build_info.json").read_text())
    n = info["sample_problems"]
    res = agentrl("model", "eval", str(tiny_model_dir), "--problems", str(n), "--seed", str(info["eval_seed"]))
    assert res.returncode == 0, res.stderr
    measured = json.loads(res.stdout.strip().splitlines()[-1])
    # Same problems, same batches: equal on this kind of machine; one problem of slack for
    # a float tie that another CPU's kernels may break differently.
    assert abs(measured["accuracy"] - info["sample_accuracy"]) <= 1 / n + 1e-9
    assert measured["eval_problems"] == n

"""``agentrl sft``: the data it trains on (masks, trajectories, bad lines) and a real run on the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.api import NOT_SAMPLED, Trajectory, TrajectoryStatus, sampled_spans
from agentrl.errors import ConfigError
from agentrl.model.arith_data import CALCULATOR_TOOL
from agentrl.rollout.renderer import ChatRenderer
from agentrl.run.sft_data import conversation_examples, load_examples

ROOT = Path(__file__).resolve().parents[2]
AGENTRL = str(Path(sys.executable).parent / "agentrl")


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(tiny_model_dir)


def call(expression: str, call_id: str) -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})}}


TOOL_CONVERSATION = [  # OpenAI's format: a system turn, tool calls with ids, tool results, two user turns
    {"role": "system", "content": "Use the calculator."},
    {"role": "user", "content": "What is 17+72+97?"},
    {"role": "assistant", "content": None, "tool_calls": [call("17+72+97", "call_a")]},
    {"role": "tool", "tool_call_id": "call_a", "content": "186"},
    {"role": "assistant", "content": "\\boxed{186}"},
    {"role": "user", "content": "And 5*6?"},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [call("5*6", "call_b")]},
    {"role": "tool", "tool_call_id": "call_b", "content": "30"},
    {"role": "assistant", "content": "\\boxed{30}"},
]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# --------------------------------------------------------------------------- (i) the mask


def test_the_mask_of_a_tool_conversation_is_exactly_the_assistant_tokens(renderer):
    tools = [CALCULATOR_TOOL]
    [example] = conversation_examples(renderer, TOOL_CONVERSATION, tools)
    # the token stream is the renderer's own rendering of the whole conversation
    assert renderer.decode(example.input_ids) == renderer.render(TOOL_CONVERSATION, tools, add_generation_prompt=False)
    # each masked span is one assistant message as the template renders it after its generation
    # prompt (what a rollout samples: content, tool calls, the end-of-turn token), in order
    expected = []
    for i, m in enumerate(TOOL_CONVERSATION):
        if m["role"] == "assistant":
            before = renderer.render(TOOL_CONVERSATION[:i], tools, add_generation_prompt=True)
            upto = renderer.render(TOOL_CONVERSATION[: i + 1], tools, add_generation_prompt=False)
            expected.append(upto[len(before):])
    spans = [renderer.decode(example.input_ids[s:e]) for s, e in sampled_spans(example.loss_mask)]
    assert spans == expected
    assert spans[1] == "\\boxed{186}<|end|>" and spans[2].startswith("Let me check.<tool_call>")
    # and everything else — system, user, tool turns, the generation prompts — is masked
    unmasked = renderer.decode([t for t, m in zip(example.input_ids, example.loss_mask, strict=True) if not m])
    for m in TOOL_CONVERSATION:
        if m["role"] != "assistant":
            assert m["content"] in unmasked
    assert unmasked.count("<|assistant|>") == 4
    # the tiny model's own build masks the same tokens (agentrl.model.tinymodel.encode_with_mask)
    from agentrl.model.tinymodel import encode_with_mask

    assert encode_with_mask(renderer.tokenizer, TOOL_CONVERSATION, tools) == (example.input_ids, example.loss_mask)


def test_an_assistant_message_of_weight_0_is_context(renderer):
    convo = [dict(m) for m in TOOL_CONVERSATION]
    convo[4]["weight"] = 0
    [full] = conversation_examples(renderer, TOOL_CONVERSATION, [CALCULATOR_TOOL])
    [some] = conversation_examples(renderer, convo, [CALCULATOR_TOOL])
    assert some.input_ids == full.input_ids
    assert len(sampled_spans(some.loss_mask)) == 3
    assert sum(full.loss_mask) - sum(some.loss_mask) == len(renderer.encode("\\boxed{186}<|end|>"))


# --------------------------------------------------------------------------- (ii) trajectories


def trajectory(ids: list[int], sampled_from: int, reward: float, **kw) -> Trajectory:
    n = len(ids)
    mask = [0] * sampled_from + [1] * (n - sampled_from)
    return Trajectory(ids, mask, [0.0] * sampled_from + [-0.5] * (n - sampled_from),
                      [NOT_SAMPLED] * sampled_from + [3] * (n - sampled_from), reward=reward, **kw)


def test_recorded_trajectories_are_kept_as_recorded_and_filtered_by_reward(renderer, tmp_path):
    good, bad = trajectory([5, 6, 7, 8, 9], 2, 1.0), trajectory([5, 6, 7, 1, 2, 3], 3, 0.0)
    failed = Trajectory.failed(TrajectoryStatus.TIMEOUT)
    # the gateway's trajectories.jsonl: to_dict() + session_id + metadata
    gateway = write_jsonl(tmp_path / "trajectories.jsonl", [
        {**t.to_dict(), "session_id": f"s{i}", "metadata": {"agent": "x"}} for i, t in enumerate((good, bad, failed))])
    # a run's trajectories/step_N.jsonl: to_dict() + each token's text and the trainer's numbers
    steps = tmp_path / "trajectories"
    steps.mkdir()
    write_jsonl(steps / "step_000001.jsonl", [{**t.to_dict(), "tokens": ["a"] * len(t), "advantage": 0.5,
                                               "trainer_logprobs": [0.0] * len(t)} for t in (bad, good)])
    # agentrl eval's eval.jsonl with --samples
    evals = write_jsonl(tmp_path / "eval.jsonl", [{"index": 0, "k": 2, "successes": 1, "failed": 0, "row": {"q": 1},
                                                   "samples": [good.to_dict() | {"sample": 0},
                                                               bad.to_dict() | {"sample": 1}]}])
    data = load_examples([str(gateway), str(steps), str(evals)], renderer, min_reward=0.5)
    assert [(e.input_ids, e.loss_mask) for e in data.examples] == [(good.input_ids, good.loss_mask)] * 3
    assert [e.source for e in data.examples] == [f"{gateway}:1", f"{steps / 'step_000001.jsonl'}:2", f"{evals}:1"]
    assert data.dropped == {"below_min_reward": 3, "failed_timeout": 1}
    both = load_examples([str(gateway)], renderer)  # no min_reward: both rewards, the failed one still dropped
    assert [e.input_ids for e in both.examples] == [good.input_ids, bad.input_ids]
    assert both.dropped == {"failed_timeout": 1}


def test_a_runs_episode_log_gives_its_finished_episodes(renderer, tmp_path):
    """``RUN_DIR/rollout/episodes.jsonl`` as the run's own ``EpisodeLog`` writes it: a finished
    episode's trajectories are data (filtered by reward); an unfinished one's calls are skipped and
    counted; a ``forget`` (trained on) does not unmake the episode."""
    from agentrl.api import Completion, SamplingParams
    from agentrl.rollout.journal import EpisodeLog, call_digest

    good, bad = trajectory([5, 6, 7, 8, 9], 2, 1.0), trajectory([5, 6, 7, 1, 2, 3], 3, 0.0)
    log = EpisodeLog(tmp_path / "rollout" / "episodes.jsonl")
    log.record_call("1:0", 0, call_digest([5, 6], SamplingParams()), Completion([7], [-0.1], [3], "length"),
                    partial=True)
    log.record_episode("0:0", [good, bad])
    log.forget(["0:0"])
    log.close()
    data = load_examples([str(tmp_path / "rollout")], renderer, min_reward=0.5)
    assert [(e.input_ids, e.loss_mask) for e in data.examples] == [(good.input_ids, good.loss_mask)]
    assert data.dropped == {"below_min_reward": 1, "unfinished_episode_calls": 1}
    assert data.examples[0].source == f"{tmp_path / 'rollout' / 'episodes.jsonl'}:2"


def test_the_first_token_is_never_a_loss_token_and_ids_with_a_mask_suffice(renderer, tmp_path):
    t = Trajectory([4, 5, 6], [1, 1, 1], [-0.1] * 3, [0] * 3)
    path = write_jsonl(tmp_path / "t.jsonl", [t.to_dict(), {"input_ids": [7, 8, 9, 10], "loss_mask": [0, 0, 1, 1]}])
    assert [(e.input_ids, e.loss_mask) for e in load_examples([str(path)], renderer).examples] == [
        ([4, 5, 6], [0, 1, 1]), ([7, 8, 9, 10], [0, 0, 1, 1])]


# --------------------------------------------------------------------------- (iv) bad input


BAD_LINES = [
    ("{not json", "not valid JSON"),
    ({"question": "What is 1+1?", "answer": "2"}, "expected an OpenAI conversation"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant message to train on"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "message 0: 'role' must be one of"),
    ({"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "x"}]}, "'content' must be"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None,
                                                      "tool_calls": [{"function": {"name": 1}}]}]}, "tool_calls[0]"),
    ({"messages": "hi"}, "'messages' must be a non-empty list"),
    ({"input_ids": [1, 2], "loss_mask": [0, 1], "logprobs": [0.0, -1.0], "versions": [-1, -1]}, "not a valid trajectory"),
    ({"input_ids": [1, 2, 3], "loss_mask": [0, 1]}, "not a valid trajectory"),
    ({"index": 0, "k": 4, "successes": 1, "row": {}}, "--samples N"),
    ({"kind": "episode", "key": "0:0", "trajectories": [{"input_ids": [1]}]}, "trajectories[0]: not a valid"),
    ([1, 2], "expected a JSON object"),
    # issue 49: calls to tools not offered, and arguments that are not JSON, were trained on
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "rm_rf", "arguments": "{}"}}]}], "tools": [CALCULATOR_TOOL]},
     "calls \"rm_rf\", which the conversation's tools do not offer"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": "{expression: 1+1"}}]}],
      "tools": [CALCULATOR_TOOL]}, "arguments is not JSON"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ({"input_ids": [1, 2, 10**6], "loss_mask": [0, 1, 1]}, "token id 1000000 is outside the model's vocabulary"),
]


@pytest.mark.parametrize("line,expected", BAD_LINES, ids=[e for _, e in BAD_LINES])
def test_a_bad_line_is_one_error_naming_file_and_line(renderer, tmp_path, line, expected):
    good = {"messages": TOOL_CONVERSATION[1:5], "tools": [CALCULATOR_TOOL]}
    path = write_jsonl(tmp_path / "data.jsonl", [good, "", line])
    with pytest.raises(ConfigError) as info:
        load_examples([str(path)], renderer)
    msg = str(info.value)
    assert msg.startswith(f"{path}:3: ") and expected in msg and "\n" not in msg, msg


def test_examples_past_the_context_are_dropped_and_counted_and_a_huge_line_is_never_read(renderer, tmp_path):
    """Issue 49: a 3,050-token conversation trained on a 1,024-token context with no drop or
    count, and a 50 MB line tried to allocate 25.6 GB. Both are dropped and counted now; the huge
    line without being parsed. Invalid UTF-8 is one line naming file:line."""
    long = {"messages": [{"role": "user", "content": "What is 1+2? " * 300}, {"role": "assistant", "content": "3"}]}
    good = {"messages": TOOL_CONVERSATION[1:5], "tools": [CALCULATOR_TOOL]}
    path = write_jsonl(tmp_path / "data.jsonl", [good, long])
    with open(path, "a") as f:
        f.write('{"messages": "' + "x" * (50 << 20) + '"}\n')
    data = load_examples([str(path)], renderer, max_tokens=1024)
    assert len(data.examples) == 1 and data.dropped["over_max_tokens"] == 2
    from agentrl.run.sft import model_positions

    assert model_positions(renderer.tokenizer.name_or_path) == 1024  # what agentrl sft bounds max_tokens by
    (tmp_path / "bad.jsonl").write_bytes(b'{"messages": "\xff"}\n')
    with pytest.raises(ConfigError, match="bad.jsonl:1: not UTF-8 text"):
        load_examples([str(tmp_path / "bad.jsonl")], renderer)


def test_missing_data_is_named(renderer, tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_examples([str(tmp_path / "nope.jsonl")], renderer)
    with pytest.raises(ConfigError, match="holds no"):
        load_examples([str(tmp_path)], renderer)


# --------------------------------------------------------------------------- (iii) the command


def test_help_config_lists_the_keys():
    r = subprocess.run([AGENTRL, "sft", "--help-config"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    keys = {line.split()[0] for line in r.stdout.splitlines() if line and not line.startswith(" ")}
    assert {"model", "data", "heldout", "heldout_fraction", "min_reward", "steps", "epochs", "batch_size",
            "run_dir", "seed", "trainer.lr", "trainer.warmup_steps", "trainer.total_steps"} <= keys


def test_bad_data_through_the_command_is_one_line(tiny_model_dir, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "q"}])
    r = subprocess.run([AGENTRL, "sft", str(ROOT / "examples" / "sft_tools.yaml"), f"model={tiny_model_dir}",
                        f"data=[{path}]", f"run_dir={tmp_path / 'run'}"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert r.stderr.startswith(f"agentrl sft: error: {path}:1: expected an OpenAI conversation"), r.stderr
    assert not (tmp_path / "run").exists()


def sft_on_calculator_conversations(model_dir: Path, tmp_path: Path, train_n: int, held_n: int,
                                    *overrides: str) -> subprocess.CompletedProcess:
    """``agentrl sft examples/sft_tools.yaml`` on ``train_n`` generated conversations (``held_n``
    held out), into ``tmp_path / "run"``."""
    sys.path.insert(0, str(ROOT))
    try:
        from examples.sft_tools import heldout_conversations, train_conversations
    finally:
        sys.path.remove(str(ROOT))
    train = write_jsonl(tmp_path / "train.jsonl", train_conversations(0, n=train_n))
    held = write_jsonl(tmp_path / "held.jsonl", heldout_conversations(0, n=held_n))
    return subprocess.run([AGENTRL, "sft", str(ROOT / "examples" / "sft_tools.yaml"), f"model={model_dir}",
                           f"data=[{train}]", f"heldout=[{held}]", f"run_dir={tmp_path / 'run'}", "batch_size=6",
                           "trainer.warmup_steps=0", *overrides], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_sft_lowers_the_heldout_loss_and_its_checkpoint_serves(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    r = sft_on_calculator_conversations(tiny_model_dir, tmp_path, 24, 6, "steps=3", "log_every_steps=1",
                                        "eval_every_steps=2", "trainer.lr=3e-3", "trainer.total_steps=3")
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    print("held-out loss", summary["heldout_loss_before"], "->", summary["heldout_loss_after"])
    assert summary["heldout_loss_after"] < summary["heldout_loss_before"] - 0.1
    assert (summary["steps"], summary["train_examples"], summary["heldout_examples"]) == (3, 24, 6)
    assert summary["checkpoint"] == str(run_dir / "model") and summary["run_dir"] == str(run_dir)
    assert sum("sft step" in line for line in r.stdout.splitlines()) == 3
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "train/loss" in row] == [1, 2, 3]
    held_rows = [(row["step"], row["eval/heldout_loss"]) for row in rows if "eval/heldout_loss" in row]
    assert [s for s, _ in held_rows] == [0, 2, 3]
    assert held_rows[0][1] == pytest.approx(summary["heldout_loss_before"])
    assert held_rows[-1][1] == pytest.approx(summary["heldout_loss_after"])
    assert json.loads((run_dir / "summary.json").read_text())["heldout_loss_after"] == summary["heldout_loss_after"]

    # the checkpoint is an HF directory that agentrl serve loads, with other weights than the start
    import httpx
    from safetensors.torch import load_file

    from agentrl.process.services import ServerProcess

    before, after = (load_file(str(d / "model.safetensors")) for d in (tiny_model_dir, run_dir / "model"))
    assert before.keys() == after.keys() and any(not before[k].equal(after[k]) for k in before)
    prompt = ChatRenderer(run_dir / "model").encode("<|user|>What is 1+2?<|end|><|assistant|>")
    with ServerProcess(run_dir / "model", "--context-length", "256") as proc:
        out = httpx.post(f"{proc.url}/generate", json={"input_ids": prompt, "sampling_params": {
            "temperature": 0.0, "max_new_tokens": 8}}, timeout=60).json()
    assert len(out["output_ids"]) > 0, out


def test_a_run_killed_after_a_checkpoint_resumes_to_where_it_would_have_ended(tiny_model_dir, tmp_path):
    """``agentrl sft --resume``: the run is left as a crash after its step-2 checkpoint leaves
    it (no model, no summary, metrics logged past the checkpoint); the resumed run restores the
    trainer, skips the batches trained on and ends with the uninterrupted run's weights and losses."""
    import shutil

    import torch
    from safetensors.torch import load_file

    sys.path.insert(0, str(ROOT))
    try:
        from examples.sft_tools import heldout_conversations, train_conversations
    finally:
        sys.path.remove(str(ROOT))
    train = write_jsonl(tmp_path / "train.jsonl", train_conversations(2, n=12))
    held = write_jsonl(tmp_path / "held.jsonl", heldout_conversations(0, n=4))
    whole, crashed = tmp_path / "whole", tmp_path / "crashed"
    sft = lambda *args: subprocess.run([AGENTRL, "sft", *args], capture_output=True, text=True,  # noqa: E731
                                       timeout=300, cwd=ROOT)
    r = sft(str(ROOT / "examples" / "sft_tools.yaml"), f"model={tiny_model_dir}", f"data=[{train}]",
            f"heldout=[{held}]", f"run_dir={whole}", "steps=4", "batch_size=4", "eval_every_steps=0", "threads=1",
            "checkpoint.every_steps=2", "checkpoint.keep_last=2", "trainer.warmup_steps=1", "trainer.total_steps=3")
    assert r.returncode == 0, r.stdout + r.stderr
    expected = json.loads(r.stdout.strip().splitlines()[-1])
    assert sorted(p.name for p in (whole / "checkpoints").iterdir()) == ["latest", "step_000002", "step_000004"]

    shutil.copytree(whole, crashed)
    shutil.rmtree(crashed / "checkpoints" / "step_000004")
    (crashed / "checkpoints" / "latest").write_text("step_000002")
    shutil.rmtree(crashed / "model")
    (crashed / "summary.json").unlink()
    r = sft("--resume", str(crashed))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resumed from step_000002 (step 2 of 4)" in r.stdout
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["resumed_from_step"] == 2 and summary["steps"] == 4
    assert summary["heldout_loss_before"] == expected["heldout_loss_before"]
    assert summary["heldout_loss_after"] == pytest.approx(expected["heldout_loss_after"], abs=1e-6)
    rows = lambda run: [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    losses = lambda run: [row.get("train/loss", row.get("eval/heldout_loss")) for row in rows(run)]  # noqa: E731
    assert [row["step"] for row in rows(crashed)] == [0, 1, 2, 3, 4, 4]  # what the crash logged past 2 is gone
    assert losses(crashed) == pytest.approx(losses(whole), abs=1e-6)
    a, b = (load_file(str(run / "model" / "model.safetensors")) for run in (whole, crashed))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)

    r = sft("--resume", str(crashed))  # a finished run trains on only when told to
    assert r.returncode == 2 and f"{crashed} is complete at step 4 of 4; to train it on, raise steps" in r.stderr


# --------------------------------------------------------------------------- the pieces of the run


def test_the_trainers_reinforce_loss_on_sft_batches_is_the_token_mean_nll():
    """SFT reuses the actor's loss: with advantage 1 on the loss tokens (``train_batch``),
    reinforce's Σ m·(-A·log π) / N is the mean negative log-likelihood of the loss tokens."""
    import torch

    from agentrl.run.sft import train_batch
    from agentrl.run.sft_data import SftExample
    from agentrl.trainer.losses import policy_loss

    [seq] = train_batch([SftExample([3, 4, 5, 6], [0, 1, 0, 1], "x")]).sequences
    logp = torch.tensor([-9.0, -0.5, -7.0, -1.5])
    loss, _ = policy_loss("reinforce", logp, seq["behaviour_logprobs"], seq["advantages"], seq["loss_mask"],
                          total_loss_tokens=2.0)
    assert float(loss) == pytest.approx((0.5 + 1.5) / 2)  # the masked tokens' -9 and -7 do not count


def test_the_heldout_split_keeps_whole_records_and_the_stream_walks_epochs(tiny_model_dir, tmp_path):
    from agentrl.config import load_config
    from agentrl.run.sft import batch_stream, load_data, num_steps
    from agentrl.run.sft_config import SftConfig

    convo = {"messages": TOOL_CONVERSATION[1:5], "tools": [CALCULATOR_TOOL]}
    path = write_jsonl(tmp_path / "d.jsonl", [convo] * 20)
    cfg = load_config(SftConfig, None, [f"model={tiny_model_dir}", f"data=[{path}]", "heldout_fraction=0.25",
                                        "batch_size=4", "epochs=2"])
    train, held = load_data(cfg)
    sources = lambda d: {r.source for r in d.records}  # noqa: E731
    assert (len(train.records), len(held.records)) == (15, 5) and not sources(train) & sources(held)
    assert sources(load_data(cfg)[1]) == sources(held)  # seeded
    assert num_steps(cfg, 15) == 8  # 2 epochs of ceil(15 / 4)
    stream = batch_stream(train.examples, 4, seed=0)
    seen = [e.source for _ in range(8) for e in next(stream)]
    assert sorted(seen[:15]) == sorted(sources(train)) and sorted(seen[15:30]) == sorted(sources(train))


def test_two_ranks_under_torchrun_train_as_one(tiny_model_dir, tmp_path):
    """``world_size=2`` runs the ranks under torchrun; the actor's split makes the step (and so the
    held-out losses) the same as one rank's."""
    sys.path.insert(0, str(ROOT))
    try:
        from examples.sft_tools import heldout_conversations, train_conversations
    finally:
        sys.path.remove(str(ROOT))
    train = write_jsonl(tmp_path / "train.jsonl", train_conversations(1, n=8))
    held = write_jsonl(tmp_path / "held.jsonl", heldout_conversations(0, n=4))
    summaries = []
    for world in (1, 2):
        r = subprocess.run([AGENTRL, "sft", str(ROOT / "examples" / "sft_tools.yaml"), f"model={tiny_model_dir}",
                            f"data=[{train}]", f"heldout=[{held}]", f"run_dir={tmp_path / f'run{world}'}", "steps=2",
                            "batch_size=4", f"world_size={world}", "threads=1"],
                           capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert r.returncode == 0, r.stdout + r.stderr
        summaries.append(json.loads(r.stdout.strip().splitlines()[-1]))
    one, two = summaries
    assert two["heldout_loss_before"] == pytest.approx(one["heldout_loss_before"], abs=1e-6)
    assert two["heldout_loss_after"] == pytest.approx(one["heldout_loss_after"], abs=1e-5)
    assert two["heldout_loss_after"] < two["heldout_loss_before"]


def test_a_lora_sft_run_exports_its_adapter_and_the_merged_model(tiny_model_dir, tmp_path):
    """``agentrl sft trainer.lora.rank=8``: only the adapters train (the held-out loss still falls),
    ``RUN_DIR/adapter`` is peft's adapter and ``RUN_DIR/model`` the base with it merged — the base's
    other tensors unchanged, and the same logits as the base wrapped in the adapter by peft."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    run_dir = tmp_path / "run"
    r = sft_on_calculator_conversations(tiny_model_dir, tmp_path, 12, 4, "steps=2", "trainer.lr=2e-2",
                                        "trainer.total_steps=2", "trainer.lora.rank=8",
                                        "trainer.lora.target_modules=[q_proj,v_proj,down_proj]")
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["heldout_loss_after"] < summary["heldout_loss_before"]
    assert sorted(p.name for p in (run_dir / "adapter").iterdir()) == ["adapter_config.json",
                                                                      "adapter_model.safetensors"]
    before, after = (load_file(str(d / "model.safetensors")) for d in (tiny_model_dir, run_dir / "model"))
    changed = {k for k in before if not before[k].equal(after[k])}
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight", "down_proj.weight")) for k in changed)
    ids = torch.tensor([list(range(3, 40))])
    with torch.no_grad():
        wrapped = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), run_dir / "adapter")
        merged = AutoModelForCausalLM.from_pretrained(run_dir / "model")
        torch.testing.assert_close(merged(ids).logits, wrapped(ids).logits, rtol=0, atol=1e-4)

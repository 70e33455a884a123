"""`agentrl replay`: a finished run's recorded episodes scored again with another reward function,
nothing generated, the run's own files untouched (on the shared short run of tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.errors import ConfigError
from agentrl.run.replay import run_replay

ROOT = Path(__file__).resolve().parents[2]
AGENTRL = Path(sys.executable).parent / "agentrl"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}


def replay(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(AGENTRL), "replay", *args], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=120)


def recorded(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((run_dir / "record").iterdir())}


def test_the_envs_own_reward_changes_nothing_and_another_changes_what_it_should(trained_run, tmp_path, monkeypatch):
    run_dir, _ = trained_run
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # replay_rewards, in-process too
    before = recorded(run_dir)
    out = replay(str(run_dir), "--reward", "replay_rewards:correct", "--out", str(tmp_path / "same"))
    assert out.returncode == 0, out.stderr
    same = json.loads(out.stdout.strip().splitlines()[-1])  # the last line: one JSON object
    assert same["episodes"] == same["rescored"] == 3 * 16 and same["changed"] == 0 and same["unscored"] == 0
    assert same["reward_mean_recorded"] == same["reward_mean_rescored"]
    # a Rubric works as well as a function; an async function as well as a plain one
    assert run_replay(run_dir, "replay_rewards:rubric", tmp_path / "rubric")["changed"] == 0
    fmt = run_replay(run_dir, "replay_rewards:exact_format", tmp_path / "format")
    rows = [json.loads(line) for name in before for line in (run_dir / "record" / name).read_text().splitlines()]
    facts = [next(e for e in r["record"]["events"] if e["kind"] == "step")["info"] for r in rows]
    assert fmt["changed"] == sum(float(f["exact_format"]) != r["reward"] for f, r in zip(facts, rows, strict=True))
    assert fmt["changed"] > 0  # the tiny model boxes nearly every answer, right or not
    rescored = [json.loads(line) for line in (tmp_path / "format" / "step_000002.jsonl").read_text().splitlines()]
    original = [json.loads(line) for line in before["step_000002.jsonl"].decode().splitlines()]
    for new, old in zip(rescored, original, strict=True):  # the same rows, the new reward, the old one kept
        assert new["input_ids"] == old["input_ids"] and new["logprobs"] == old["logprobs"]
        assert new["metrics"]["replay/recorded_reward"] == old["reward"]
    assert recorded(run_dir) == before  # the run's record is never written


def test_bad_input_is_one_line_saying_what_to_do(trained_run, tmp_path):
    run_dir, _ = trained_run
    out = replay(str(tmp_path / "missing"), "--reward", "replay_rewards:correct")
    assert out.returncode == 2 and "is not a directory" in out.stderr
    with pytest.raises(ConfigError, match="holds no recorded steps .* logging.record: true"):
        run_replay(tmp_path, "replay_rewards:correct")
    with pytest.raises(ConfigError, match="expected MODULE:FN"):
        run_replay(run_dir, "replay_rewards")
    with pytest.raises(ConfigError, match="has no 'nope'"):
        run_replay(run_dir, "agentrl.env.rewards:nope")
    with pytest.raises(ConfigError, match=r"takes \(\); a reward function takes one argument, a RewardInput"):
        run_replay(run_dir, "os:getcwd")
    with pytest.raises(ConfigError, match="returned <function .* a reward is a finite number"):
        run_replay(run_dir, "agentrl.env.rewards:fact", tmp_path / "x")
    with pytest.raises(ConfigError, match="is the input"):
        run_replay(run_dir, "agentrl.env.rewards:boxed_format", run_dir / "record")


def test_out_never_overwrites_an_earlier_replay_or_the_run(tmp_path):
    """Issue 49: a second replay into the same ``--out`` rewrote the first one's step files
    silently. A non-empty ``--out`` is refused unless ``--force`` (then replaced whole: no step
    of the earlier replay is left beside the new ones); the run and its record never are."""
    run = tmp_path / "run"
    (run / "record").mkdir(parents=True)
    from agentrl.api import Trajectory, TrajectoryStatus

    row = Trajectory.failed(TrajectoryStatus.ENV_ERROR, group_id="g", episode_id="e0").to_dict()
    (run / "record" / "step_000001.jsonl").write_text(json.dumps(row) + "\n")
    (run / "metrics.jsonl").write_text("{}\n")
    first = tmp_path / "first"
    assert run_replay(run, "agentrl.env.rewards:boxed_format", first)["unscored"] == 1
    (first / "step_000009.jsonl").write_text("an earlier replay's step\n")
    with pytest.raises(ConfigError, match="exists and is not empty; .* --force"):
        run_replay(run, "agentrl.env.rewards:boxed_format", first)
    assert (first / "step_000009.jsonl").is_file()
    assert run_replay(run, "agentrl.env.rewards:boxed_format", first, force=True)["out"] == str(first)
    assert sorted(p.name for p in first.iterdir()) == ["replay_summary.json", "step_000001.jsonl"]
    for out in (run, tmp_path, run / "record" / "x"):
        with pytest.raises(ConfigError, match="the input"):
            run_replay(run, "agentrl.env.rewards:boxed_format", out, force=True)
    assert sorted(p.name for p in run.rglob("*")) == ["metrics.jsonl", "record", "step_000001.jsonl"]
    # the default (RUN_DIR/replay/MODULE.FN) is refused the second time too
    run_replay(run, "agentrl.env.rewards:boxed_format")
    with pytest.raises(ConfigError, match="rewards.boxed_format' exists and is not empty"):
        run_replay(run, "agentrl.env.rewards:boxed_format")


@pytest.mark.parametrize("damage", ["oov", "nan", "short-mask", "duplicate", "not-utf8", "deep"])
def test_rows_are_checked_before_anything_is_written(damage, tmp_path, tiny_model_dir):
    """Issue 49: replay copied rows it never checked — token ids outside the model's vocabulary,
    NaN log-probabilities, masks shorter than the ids — and a row recorded twice trained as a
    larger group. Each is refused by file:line, and nothing is written."""
    from agentrl.api import Trajectory

    run = tmp_path / "run"
    (run / "record").mkdir(parents=True)
    (run / "config.yaml").write_text(f"model: {tiny_model_dir}\n")
    row = Trajectory([5, 6, 7], [0, 1, 1], [0.0, -0.5, -0.25], [-1, 0, 0], 1.0, "g", "e0").to_dict()
    other = {**row, "episode_id": "e1"}
    bad = {"oov": {**other, "input_ids": [5, 6, 10**6]}, "nan": {**other, "logprobs": [0.0, float("nan"), -0.1]},
           "short-mask": {**other, "loss_mask": [0, 1]}, "duplicate": row}.get(damage)
    step = run / "record" / "step_000001.jsonl"
    if damage == "not-utf8":
        step.write_bytes(json.dumps(row).encode() + b"\n\xff\xfe\n")
    elif damage == "deep":
        step.write_text(json.dumps(row) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    else:
        step.write_text(json.dumps(row) + "\n" + json.dumps(bad) + "\n")
    expected = {"oov": "step_000001.jsonl:2: token id 1000000 is outside the model's vocabulary",
                "nan": "step_000001.jsonl:2: not a recorded trajectory", "short-mask": ":2: not a recorded trajectory",
                "duplicate": ":2: repeats line 1", "not-utf8": "not UTF-8 text", "deep": ":2: not a JSON line"}[damage]
    with pytest.raises(ConfigError, match=expected):
        run_replay(run, "agentrl.env.rewards:boxed_format", tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_a_reward_that_raises_and_a_garbage_record_are_one_line(tmp_path, monkeypatch):
    """Issue 49: both were tracebacks."""
    from agentrl.api import Trajectory

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    run = tmp_path / "run"
    (run / "record").mkdir(parents=True)
    record = {"events": [{"kind": "reset", "task": {"answer": "3"}}, {"kind": "step", "action": "\\boxed{3}"}]}
    row = Trajectory([5, 6], [0, 1], [0.0, -0.5], [-1, 0], 1.0, "g", "e0", record=record).to_dict()
    step = run / "record" / "step_000001.jsonl"
    step.write_text(json.dumps(row) + "\n")
    with pytest.raises(ConfigError, match=r"--reward 'replay_rewards:raises' raised ZeroDivisionError: .* episode e0"):
        run_replay(run, "replay_rewards:raises", tmp_path / "a")
    step.write_text(json.dumps({**row, "record": {"events": [{"kind": 3}, "garbage"]}}) + "\n")
    with pytest.raises(ConfigError, match="episode e0: its record is not one agentrl wrote"):
        run_replay(run, "agentrl.env.rewards:boxed_format", tmp_path / "b")

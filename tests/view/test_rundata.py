"""The viewer's reading of run files while they grow, its export's bounds, and the CLI's errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.errors import ConfigError
from agentrl.view.export import truncate
from agentrl.view.page import embed_json, render_page
from agentrl.view.rundata import RunData

AGENTRL = Path(sys.executable).parent / "agentrl"


def test_metrics_are_read_as_they_grow(tmp_path):
    """A live run: a line still being written waits; a resumed run that rewrites the file resets it."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "rollout/reward_mean": 0.5}\n{"step": 2, "rollout/rew')
    run = RunData(tmp_path)
    got = run.metrics()
    assert [r["step"] for r in got["rows"]] == [1] and not got["reset"]
    with path.open("a") as f:
        f.write('ard_mean": NaN}\n{"step": 3, "train/loss": Infinity}\n')
    got = run.metrics(since=1)
    assert got["rows"] == [{"step": 2, "rollout/reward_mean": None}, {"step": 3, "train/loss": None}]
    assert got["total"] == 3
    path.write_text('{"step": 1, "rollout/reward_mean": 0.25}\n')  # resumed from step 1
    got = run.metrics(since=3)
    assert got["reset"] and got["rows"] == [{"step": 1, "rollout/reward_mean": 0.25}]


def test_trajectory_rows_get_what_the_page_filters_on(tmp_path):
    (tmp_path / "trajectories").mkdir()
    (tmp_path / "config.yaml").write_text("rollout:\n  workflow_args: {env_id: agentrl/Arith-v0}\n")
    rows = [
        {"input_ids": [1, 2, 3, 4], "loss_mask": [0, 1, 0, 1], "versions": [-1, 3, -1, 4], "episode_id": "e1"},
        {"input_ids": [1, 2], "loss_mask": [0, 1], "versions": [-1, 5], "episode_id": "e1"},
        {"input_ids": [], "loss_mask": [], "versions": [], "episode_id": "e2", "status": "timeout"},
    ]
    (tmp_path / "trajectories" / "step_000006.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "trajectories" / "step_000007.jsonl.tmp").write_text("half a file")
    run = RunData(tmp_path)
    assert run.steps() == [6]
    got = run.trajectories(6)
    assert [t["staleness"] for t in got] == [2, 0, None]  # the trainer held version 5 at step 6
    assert [(t["segment"], t["segments"]) for t in got] == [(1, 2), (2, 2), (1, 1)]
    assert [t["env"] for t in got] == ["agentrl/Arith-v0"] * 3
    assert [t["sampled_tokens"] for t in got] == [2, 1, 0]
    assert run.trajectories(99) == []


def test_a_directory_without_a_run_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="holds no run"):
        RunData(tmp_path)
    with pytest.raises(ConfigError, match="not a directory"):
        RunData(tmp_path / "absent")
    out = subprocess.run([str(AGENTRL), "view", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "holds no run" in out.stderr and "agentrl train" in out.stderr


def test_a_port_in_use_is_one_line_saying_what_to_do(tmp_path):
    import socket

    (tmp_path / "metrics.jsonl").write_text("")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([str(AGENTRL), "view", str(tmp_path), "--port", str(port)], capture_output=True,
                             text=True, timeout=60)
    assert out.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in out.stderr and "--port" in out.stderr


def test_truncation_keeps_both_ends_and_counts_the_turns_left_out():
    mask = [0] * 10 + ([1] * 20 + [0] * 10) * 3  # a prompt, then three turns each followed by env output
    n = len(mask)
    row = {"input_ids": list(range(n)), "loss_mask": mask, "versions": [0 if m else -1 for m in mask],
           "logprobs": [-0.5 if m else 0.0 for m in mask], "tokens": [str(i) for i in range(n)], "reward": 1.0}
    cut = truncate(row, 40)  # the first 20 tokens and the last 20, which start inside the third turn
    assert cut["input_ids"] == list(range(20)) + list(range(n - 20, n))
    assert all(len(cut[k]) == 40 for k in ("loss_mask", "versions", "logprobs", "tokens"))
    assert cut["truncated"] == {"head": 20, "total": n, "turns_before_tail": 3, "tail_continues": True}
    at_a_turn = truncate(row, 60)  # the last 30 start where the third turn starts
    assert at_a_turn["truncated"] == {"head": 30, "total": n, "turns_before_tail": 2, "tail_continues": False}
    assert truncate(row, n) is row and row["input_ids"] == list(range(n))


def test_embedded_data_cannot_close_its_script_element():
    hostile = {"t": "</script><script>alert(1)</script><!-- & \u2028"}
    text = embed_json(hostile)
    assert "<" not in text and ">" not in text and json.loads(text) == hostile
    page = render_page(hostile, title="</title>__DATA__")
    assert page.count("</script>") == 2  # the data's script element and the viewer's, nothing else
    assert "&lt;/title&gt;__DATA__" in page

"""reasoning-gym's tasks, unchanged, as ``reasoning_gym/<task>``: checked, played by the tiny model
through a real ``agentrl serve``, and trained on with ``agentrl train``.

The bug stories: an adapter that scores with its own parser instead of the task's
``score_answer`` (rewards that disagree with reasoning-gym's), and a held-out split that shares
generator seeds with the train split (evaluation on trained tasks).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium
import pytest
import reasoning_gym

from agentrl.api import SamplingParams, TrajectoryStatus
from agentrl.client.remote_engine import RemoteEngine
from agentrl.env.checks import check_text_env
from agentrl.errors import ConfigError
from agentrl.plugins import find_env
from envs.interop.reasoning_gym_env import eval_rows, extract_answer, train_rows
from workflows.env import EnvWorkflow

ROOT = Path(__file__).resolve().parents[2]
AGENTRL = str(Path(sys.executable).parent / "agentrl")
SMALL_SUMS = {"config": {"min_terms": 3, "max_terms": 3, "min_digits": 2, "max_digits": 2}}
"""chain_sum as the tiny model was trained on (a+b+c of two-digit numbers)."""


def test_envs_check_passes_from_the_command_line_with_no_other_argument():
    r = subprocess.run([AGENTRL, "envs", "check", "reasoning_gym/chain_sum"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("reasoning_gym/chain_sum: ok"), r.stdout + r.stderr
    listed = subprocess.run([AGENTRL, "envs"], capture_output=True, text=True, timeout=120).stdout
    line = next(x for x in listed.splitlines() if x.startswith("reasoning_gym/<task>"))
    assert f"{len(reasoning_gym.factory.DATASETS)} procedural tasks" in line


@pytest.mark.parametrize("task", ["letter_counting", "basic_arithmetic"])
def test_other_tasks_pass_the_checks(task):
    assert check_text_env(f"reasoning_gym/{task}") == []


def test_rewards_are_the_tasks_own_score_answer():
    env = gymnasium.make(find_env("reasoning_gym/chain_sum"))
    ds = reasoning_gym.create_dataset("chain_sum", size=10_000, seed=0)
    for index in (0, 5):
        entry = ds[index]
        obs, _ = env.reset(options={"task": {"split": "train", "index": index}})
        assert obs == [{"role": "user", "content": entry["question"]}]
        assert env.step(f"so \\boxed{{{entry['answer']}}}")[1] == 1.0
        env.reset(options={"task": {"split": "train", "index": index}})
        wrong = str(int(entry["answer"]) + 1)
        _, reward, terminated, _, info = env.step(f"<answer>{wrong}</answer>")
        assert terminated and reward == ds.score_answer(answer=wrong, entry=entry) and info["answer"] == wrong
    with pytest.raises(Exception, match="index"):
        env.reset(options={"task": {"split": "eval", "index": 500}})
    env.close()
    assert extract_answer("\\boxed{\\frac{1}{2}} then") == "\\frac{1}{2}"
    assert extract_answer("x <answer> 7 </answer>", "answer_tag") == "7"
    assert extract_answer("  42 ") == "42" and extract_answer("42", "boxed") is None


def test_train_and_eval_splits_use_disjoint_generator_seeds():
    env = gymnasium.make("reasoning_gym/chain_sum", size=50, eval_size=20).unwrapped
    train, held_out = env.splits["train"], env.splits["eval"]
    assert set(range(train.seed, train.seed + len(train))).isdisjoint(range(held_out.seed, held_out.seed + len(held_out)))
    # reasoning-gym seeds entry i with seed + i: eval entry 0 is what a 51st train entry would be
    longer = reasoning_gym.create_dataset("chain_sum", size=51, seed=0)
    assert held_out[0]["question"] == longer[50]["question"]
    assert [r["split"] for r in train_rows(0)[:2] + eval_rows(0)[:2]] == ["train", "train", "eval", "eval"]
    env.close()


def test_unknown_task_and_bad_config_are_explained():
    with pytest.raises(ConfigError, match="did you mean 'reasoning_gym/chain_sum'"):
        find_env("reasoning_gym/chain_sm")
    with pytest.raises(Exception, match="refused config"):
        gymnasium.make("reasoning_gym/chain_sum", config={"no_such_key": 1})


def test_a_missing_package_names_the_extra(monkeypatch):
    import envs.interop.reasoning_gym_env as adapter

    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    with pytest.raises(ConfigError, match=r"pip install 'agentrl\[reasoning-gym\]'"):
        adapter.tasks()
    assert "not installed: pip install 'agentrl[reasoning-gym]'" in adapter.listing()


@pytest.mark.parametrize("task", ["chain_sum", "letter_counting"])
async def test_episodes_through_a_real_server(task, tiny_server, tiny_model_dir):
    kwargs = SMALL_SUMS if task == "chain_sum" else {}
    wf = EnvWorkflow(f"reasoning_gym/{task}", tiny_model_dir, SamplingParams(max_new_tokens=16, temperature=1.0),
                     kwargs)
    env = gymnasium.make(f"reasoning_gym/{task}", **kwargs).unwrapped
    async with RemoteEngine(tiny_server.url) as engine:
        for index in range(3):
            row = {"split": "eval", "index": index}
            (traj,) = await wf.arun_episode(engine, row)
            assert traj.status == TrajectoryStatus.OK, traj.error
            reply = wf.renderer.decode([t for t, m in zip(traj.input_ids, traj.loss_mask, strict=True) if m],
                                       skip_special_tokens=True)
            env.reset(options={"task": row})  # the same reply, scored by reasoning-gym again
            assert traj.reward == env.step(reply)[1]
    env.close()


def test_a_short_train_on_a_reasoning_gym_task(tmp_path):
    """examples/reasoning_gym_grpo.yaml, two small steps."""
    small = [f"run_dir={tmp_path / 'run'}", "steps=2", "max_minutes=null", "rollout.batch_size=2",
             "rollout.group_size=4", "eval.limit=8", "eval.every_steps=0", "logging.trajectories_per_step=2"]
    out = subprocess.run([AGENTRL, "train", "examples/reasoning_gym_grpo.yaml", *small], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["counters"]["episodes_failed"] == 0, summary
    assert summary["eval_before"] is not None and summary["eval_after"] is not None
    sampled = json.loads((tmp_path / "run" / "trajectories" / "step_000001.jsonl").read_text().splitlines()[0])
    assert "State the final answer to the following arithmetic problem" in "".join(sampled["tokens"])


def test_agentrl_eval_on_a_reasoning_gym_task(tmp_path):
    out = subprocess.run([AGENTRL, "eval", "examples/reasoning_gym_grpo.yaml", "--out", str(tmp_path / "eval"),
                          "eval.limit=6"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["problems"] == 6 and report["failed_episodes"] == 0, report
    rows = [json.loads(line)["row"] for line in (tmp_path / "eval" / "eval.jsonl").read_text().splitlines()]
    assert {r["split"] for r in rows} == {"eval"}  # the held-out split, never a train index

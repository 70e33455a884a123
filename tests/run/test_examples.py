"""The examples run: a task written in one file (`examples/custom_task.py`) trains end to end, and
every example config runs on the tiny model as written, with short overrides (issue 31's rule: each
says in its first lines what it is and how to run it, and a test runs each)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_CONFIGS = sorted((ROOT / "examples").glob("*.yaml"))


def test_custom_task_trains_end_to_end(tmp_path):
    out = subprocess.run([sys.executable, "examples/custom_task.py", f"run_dir={tmp_path / 'run'}", "steps=2",
                          "eval.limit=30", "rollout.batch_size=4"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["counters"]["episodes_failed"] == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if r["step"] == 1 and "rollout/reward_mean" in r)
    assert step["rollout/trajectories"] == 4 * 16 and "rollout/success_rate" in step


def test_code_agent_docker_config_runs_on_the_tiny_model(tmp_path, docker_ready):
    """A smoke test of the CodeAgent + Docker config (meant for real code models): the tiny model
    writes no working code, every reward is 0, and the loop still runs a step end to end."""
    agentrl = Path(sys.executable).parent / "agentrl"
    out = subprocess.run([str(agentrl), "train", "examples/code_agent_docker.yaml", f"run_dir={tmp_path / 'run'}",
                          "steps=1", "rollout.batch_size=2", "rollout.group_size=2", "rollout.sampling.max_new_tokens=48",
                          "eval.limit=2", "eval.sampling.max_new_tokens=48", "checkpoint.every_steps=0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    # its HumanEval prompts do not fit the tiny model's 1,024-token context: every episode fails,
    # and the run says so and exits 1 (issue 31) instead of reporting success
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "episodes failed (inference_error" in out.stderr and "longer than the model's context length" in out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 1 and summary["eval_before"] == 0.0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if "rollout/trajectories" in r)
    assert step["step"] == 1 and step["rollout/trajectories"] == 4  # failed episodes (too long a prompt) count too


def test_gateway_agent_waits_for_its_run_and_refuses_an_empty_gateway(tmp_path):
    """Issue 31: the docstring's two commands raced (a missing gateway.json, then an agent that
    printed {"groups_played": 0} and exited 0). Now --run-dir waits for the run's gateway.json,
    an empty --gateway is refused, and an agent that played nothing exits 1 saying why."""
    agent = [sys.executable, "examples/gateway_agent.py"]
    r = subprocess.run([*agent, "--gateway", ""], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--gateway must be the gateway's URL" in r.stderr, r.stderr
    r = subprocess.run([*agent, "--run-dir", str(tmp_path), "--wait", "1"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "gateway.json did not appear within 1 s" in r.stderr, r.stderr
    late = subprocess.Popen([*agent, "--run-dir", str(tmp_path), "--wait", "30", "--groups", "1"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)  # the run writes its gateway.json after the agent started
    (tmp_path / "gateway.json").write_text(json.dumps({"url": "http://127.0.0.1:9"}))  # nothing listens there
    out, err = late.communicate(timeout=60)
    assert late.returncode == 1 and "no group was played" in err, out + err


def test_external_agent_config_trains_on_a_program_that_plays_through_the_gateway(tmp_path):
    """Issue 31: ExternalAgentWorkflow had no YAML (its keys had to be guessed). The shipped one
    trains a step on episodes that examples/external_agent.py plays as separate processes."""
    agentrl = Path(sys.executable).parent / "agentrl"
    out = subprocess.run([str(agentrl), "train", "examples/external_agent.yaml", f"run_dir={tmp_path / 'run'}",
                          "steps=1", "rollout.batch_size=1", "rollout.group_size=4", "eval.limit=2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)  # each episode is a process
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 1 and summary["counters"]["episodes_finished"] >= 4
    assert summary["counters"]["episodes_failed"] == 0


def test_arith_retry_config_trains_multi_turn_episodes(tmp_path):
    """examples/arith_retry.yaml (agentrl/ArithRetry-v0, up to 3 answers) was run by no test. Two
    short steps: the episodes take more than one turn — a wrong sum gets "Too high/low. Try
    again." as a user turn inside the one token stream, masked out of the loss."""
    agentrl = Path(sys.executable).parent / "agentrl"
    out = subprocess.run([str(agentrl), "train", "examples/arith_retry.yaml", f"run_dir={tmp_path / 'run'}",
                          "steps=2", "rollout.batch_size=4", "rollout.group_size=4", "eval.limit=20",
                          "checkpoint.every_steps=0", "logging.tensorboard=false"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["counters"]["episodes_failed"] == 0
    assert summary["eval_before"] is not None and summary["eval_after"] is not None
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/turns_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(1.0 < r["rollout/turns_mean"] <= 3.0 for r in steps), [r["rollout/turns_mean"] for r in steps]
    sampled = [json.loads(line) for path in sorted((tmp_path / "run" / "trajectories").glob("step_*.jsonl"))
               for line in path.read_text().splitlines()]
    assert sampled and all(r["status"] == "ok" and 1 <= r["num_turns"] <= 3 for r in sampled)
    assert all(r["metrics"]["turns"] == r["num_turns"] for r in sampled)
    assert all(r["reward"] == 1.0 for r in sampled if r["num_turns"] == 1)  # the episode ends at a right answer
    retried = [r for r in sampled if r["num_turns"] > 1]
    assert retried, [r["num_turns"] for r in sampled]
    for r in retried:  # one stream: a sampled reply per turn, the feedback between them not trained on
        replies = len(re.findall(r"1+", "".join(map(str, r["loss_mask"]))))
        assert replies == r["num_turns"], (replies, r["num_turns"])
        feedback = "".join(tok for tok, m in zip(r["tokens"], r["loss_mask"], strict=True) if m == 0)
        assert feedback.count("Try again.") == r["num_turns"] - 1, feedback


def sft(config: str, run_dir: Path, *keys: str) -> Path:
    """``agentrl sft CONFIG`` into ``run_dir`` (30 short steps unless ``keys`` say otherwise); its model."""
    out = subprocess.run([str(Path(sys.executable).parent / "agentrl"), "sft", config, f"run_dir={run_dir}",
                          "steps=30", "batch_size=16", "eval_every_steps=0", *keys],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (run_dir / "model" / "config.json").is_file()
    return run_dir / "model"


def train(config: str, run_dir: Path, *keys: str) -> tuple[dict, list[dict]]:
    """Two steps of ``agentrl train CONFIG`` (8 x 8 episodes, every one logged) into ``run_dir``: its
    summary, checked to have ended well, and every logged trajectory."""
    out = subprocess.run([str(Path(sys.executable).parent / "agentrl"), "train", config, f"run_dir={run_dir}",
                          "steps=2", "rollout.batch_size=8", "rollout.group_size=8",
                          "logging.trajectories_per_step=64", "checkpoint.every_steps=0",
                          "logging.tensorboard=false", *keys], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["counters"]["episodes_failed"] == 0
    assert summary["eval_before"] is not None and summary["eval_after"] is not None
    sampled = [json.loads(line) for path in sorted((run_dir / "trajectories").glob("step_*.jsonl"))
               for line in path.read_text().splitlines()]
    assert len(sampled) == 128  # every episode of both steps
    return summary, sampled


def text(r: dict, mask: int) -> str:
    """A logged trajectory's tokens with that loss mask (1: trained on, 0: not), joined."""
    return "".join(tok for tok, m in zip(r["tokens"], r["loss_mask"], strict=True) if m == mask)


def test_tool_agent_configs_run_the_sft_stage_then_rl_on_calculator_episodes(tmp_path):
    """Issue 25's tool-use example, short: its SFT stage (calculator conversations) writes a model,
    and RL on ToolUse-v0 from that model plays episodes in which the calculator's result is a
    masked tool turn inside the one token stream; the summary carries tool_use_rate (before, after)."""
    # 30 short SFT steps: the model calls the calculator in some samples (2 steps: never)
    model = sft("examples/tool_agent_sft.yaml", tmp_path / "sft")
    summary, sampled = train("examples/tool_agent.yaml", tmp_path / "run", f"model={model}", "eval.limit=16")
    assert "tool_use_rate_after" in summary and "tool_use_rate_before" in summary  # None when nothing was right
    called = [r for r in sampled if r["num_turns"] > 1]
    assert called, [r["num_turns"] for r in sampled]  # the model called the calculator in some episodes
    for r in sampled:  # the model's calls are its own sampled text; the env's turns are never trained on
        assert "<|tool|>" not in text(r, 1), text(r, 1)
    for r in called:
        assert "<tool_call>" in text(r, 1), text(r, 1)
    # the calculator's result came back as a masked tool turn (a malformed call gets an error to read instead)
    assert any("<|tool|>" in text(r, 0) for r in called)


def test_feedback_configs_run_the_sft_stage_then_rl_on_episodes_with_a_hint(tmp_path):
    """Issue 25's feedback example, short: its SFT stage (second answers after "Too low. The answer
    ends in 6.") writes a model, and RL on ArithRetry-v0 with hint=last_digit from that model plays
    two-answer episodes in which the feedback is a masked user turn and the revised answer is the
    model's own trained text; the summary carries fixed (before, after)."""
    model = sft("examples/feedback_sft.yaml", tmp_path / "sft")
    summary, sampled = train("examples/feedback.yaml", tmp_path / "run", f"model={model}", "eval.limit=32")
    # the share of first-wrong held-out episodes fixed (the tiny model is wrong at most first answers)
    assert 0.0 <= summary["fixed_before"] <= 1.0 and 0.0 <= summary["fixed_after"] <= 1.0, summary
    retried = [r for r in sampled if r["num_turns"] == 2]
    assert retried, [r["num_turns"] for r in sampled]
    for r in retried:  # one stream: both answers trained on, the feedback between them never
        assert len(re.findall(r"1+", "".join(map(str, r["loss_mask"])))) == 2, r["loss_mask"]
        assert text(r, 0).count("Try again.") == 1, text(r, 0)
        assert "Try again" not in text(r, 1) and text(r, 1).count("\\boxed{") >= 1, text(r, 1)
        assert r["metrics"]["reward/first_wrong"] == 1.0
        assert r["metrics"]["reward/fixed"] == (1.0 if r["reward"] > 0 else 0.0)
    hinted = [r for r in retried if re.search(r"Too (high|low)\. The answer ends in \d\. Try again\.", text(r, 0))]
    assert hinted, [text(r, 0) for r in retried]  # (a reply with nothing boxed is told so instead)
    assert all(r["metrics"]["reward/first_wrong"] == 0.0 and r["reward"] == 1.0
               for r in sampled if r["num_turns"] == 1)  # right at once: nothing to fix


def test_code_docker_configs_run_the_sft_stage_then_rl_with_programs_run_in_containers(tmp_path, docker_ready):
    """Issue 25's code example, short: its SFT stage (conversations whose answer is a program's
    output) writes a model, and RL on ToolUse-v0 with the Docker sandbox plays episodes in which
    the model's code block ran in a container and what it printed came back as a masked tool
    turn; the summary carries sandbox_runs, the Docker pool's own count of programs run."""
    # 60 short SFT steps: the model writes a program in some samples (at 40 steps ~1 in 7, so the
    # logged samples held none now and then; 30 steps: never)
    model = sft("examples/code_docker_sft.yaml", tmp_path / "sft", "steps=60")
    summary, sampled = train("examples/code_docker.yaml", tmp_path / "run", f"model={model}", "eval.limit=8")
    ran = [r for r in sampled if r["num_turns"] > 1]
    assert ran, [r["num_turns"] for r in sampled]  # the model wrote a program in some episodes
    for r in sampled:  # the programs are the model's own sampled text; their output is never trained on
        assert "<|tool|>" not in text(r, 1), text(r, 1)
    for r in ran:
        assert "```" in text(r, 1) and r["metrics"]["reward/programs"] >= 1, (text(r, 1), r["metrics"])
    assert any("<|tool|>" in text(r, 0) for r in ran)
    # the counter is the containers' own: every program the logged episodes ran (all of both steps'),
    # and the evaluations' on top
    assert summary["sandbox_runs"] >= sum(r["metrics"]["reward/programs"] for r in sampled) > 0, summary
    assert "code_use_rate_after" in summary and "code_use_rate_before" in summary  # None when nothing was right


def test_swe_agent_configs_run_the_sft_stage_then_rl_on_repositories_in_containers(tmp_path, docker_ready):
    """Issue 45's software-engineering example, short: its SFT stage (scripted agents' episodes on
    tiny repositories) writes a model, and RL on agentrl/Repo-v0 from that model plays episodes in
    containers whose bash output is a masked tool turn, graded by hidden tests in a fresh container;
    the summary carries the containers started and tested_before_submit (before, after)."""
    # 10 steps of 4 conversations, no held-out loss: a model that writes tool calls (its fixes come later)
    model = sft("examples/swe_agent_sft.yaml", tmp_path / "sft", "steps=10", "batch_size=4", "heldout=[]",
                "heldout_fraction=0", "data=[examples.swe_agent:sft_conversations]")  # 1,024 conversations, not 4,096
    out = subprocess.run([str(Path(sys.executable).parent / "agentrl"), "train", "examples/swe_agent.yaml",
                          f"run_dir={tmp_path / 'run'}", f"model={model}", "steps=1", "rollout.batch_size=2",
                          "rollout.group_size=2", "eval.limit=2", "logging.trajectories_per_step=4",
                          "checkpoint.every_steps=0", "logging.tensorboard=false"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 1 and summary["counters"]["episodes_failed"] == 0, summary
    assert summary["eval_before"] is not None and "tested_before_submit_after" in summary, summary
    # each episode holds a container and each grading a fresh one: at least two per episode played
    assert summary["containers_started"] >= 2 * summary["counters"]["episodes_finished"], summary
    # every episode of the step, whole (the logged samples skip a step whose rewards are all equal)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    played = [json.loads(line) for line in (tmp_path / "run" / "record" / "step_000001.jsonl").read_text().splitlines()]
    # four episodes (one whose token stream stopped extending, a reply re-rendered, is two trajectories)
    episodes = {r["episode_id"] for r in played}
    assert len(episodes) == 4 and all(r["status"] == "ok" for r in played), played
    assert all(any("reward/ran_tests" in r["metrics"] for r in played if r["episode_id"] == e) for e in episodes)
    for r in played:  # the model's calls are its own text; what the container answered is never trained on
        r["tokens"] = [tok.decode([i]) for i in r["input_ids"]]
        assert "<|tool|>" not in text(r, 1), text(r, 1)
        assert r["num_turns"] == 1 or "<|tool|>" in text(r, 0), text(r, 0)
    assert any("<tool_call>" in text(r, 1) for r in played), [text(r, 1) for r in played]


def test_every_example_config_is_run_by_a_test():
    """Issue 31: "a test runs each" example config; examples/arith_retry.yaml had none. A test
    runs one when a line of it names the file and the command (train or sft)."""
    lines = [line for path in (ROOT / "tests").rglob("test_*.py") for line in path.read_text().splitlines()]
    for config in EXAMPLE_CONFIGS:
        assert any(config.name in line and re.search(r'"(train|sft)"|\b(train|sft)\(', line) for line in lines), \
            f"no test runs examples/{config.name}"


def header(config: Path) -> str:
    """The comment lines a config opens with, as one line of text."""
    lines = config.read_text().splitlines()
    n = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    return " ".join(" ".join(line.lstrip("#").split()) for line in lines[:n])


def test_every_example_config_opens_saying_what_it_is_and_how_to_run_it():
    assert len(EXAMPLE_CONFIGS) >= 5, EXAMPLE_CONFIGS
    for config in EXAMPLE_CONFIGS:
        text = header(config)
        assert len(text.split()) >= 10, f"examples/{config.name} opens with no header saying what it is"
        assert re.search(rf"agentrl (train|sft) examples/{re.escape(config.name)}", text), \
            f"examples/{config.name}'s header does not say how to run it"


def test_code_agent_config_says_plainly_that_the_tiny_model_writes_no_code():
    """Issue 31: run as documented on the tiny model, no container ever started and nothing said
    why — that model never writes a code block, and its 1,024-token context needs shorter answers."""
    text = header(ROOT / "examples" / "code_agent_docker.yaml")
    assert "On the tiny demo model" in text and "that model never writes a code block" in text, text
    assert "no program reaches a container and every reward is 0" in text, text
    assert "rollout.sampling.max_new_tokens=48" in text and "eval.sampling.max_new_tokens=48" in text, text

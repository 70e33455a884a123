"""The four workflows on every shipped env, against a real ``agentrl serve`` on the trained
tiny model (ExternalAgentWorkflow's agent is a real subprocess speaking HTTP to a real gateway).

The bug story: multi-turn trainers re-tokenize what was sampled and train on tokens the
model never produced. Here every trajectory is replayed against a fresh env: each prompt the
model saw must decode to the chat template's rendering of the conversation at that point,
the loss mask must cover exactly the sampled replies, and the reward must be the env's for
those replies.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import os
import random
import sys
import zlib
from pathlib import Path

import gymnasium
import pytest

import envs  # noqa: F401
from agentrl.api import NOT_SAMPLED, SamplingParams, TrajectoryStatus, sampled_spans
from agentrl.client.remote_engine import RemoteEngine
from agentrl.model.arith_data import generate_problems
from agentrl.model.tokenizer import CHAT_TEMPLATE
from agentrl.process.services import free_port
from agentrl.rollout.renderer import ChatRenderer, load_tokenizer
from envs.tool_use import make_task
from workflows.env import EnvWorkflow, state_key
from workflows.external_agent import ExternalAgentWorkflow
from workflows.single_turn import SingleTurnWorkflow
from workflows.tool_agent import ToolAgentWorkflow

ROOT = Path(__file__).resolve().parents[2]
AGENT = [sys.executable, str(ROOT / "examples" / "external_agent.py")]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the Code envs' local sandbox builds its jail as root")
SUM_TASK = {"question": "Read two integers and print their sum.",
            "inputs": ["1 2\n", "10 -3\n"], "outputs": ["3\n", "7\n"]}
MATH_ROWS = [{"question": "What is 2+3?", "answer": "5"}, {"question": "What is 10-4?", "answer": "6"}]
ENVS = {  # env id -> (env kwargs, rows)
    "agentrl/Arith-v0": ({}, [p.to_row() for p in generate_problems(3, seed=0)]),
    "agentrl/ArithRetry-v0": ({"max_attempts": 2}, [p.to_row() for p in generate_problems(3, seed=0)]),
    "agentrl/Math-v1": ({}, MATH_ROWS),
    "agentrl/MathRetry-v1": ({"max_attempts": 2}, MATH_ROWS),
    "agentrl/Code-v0": ({"sandbox": "local"}, [SUM_TASK]),
    "agentrl/CodeAgent-v0": ({"sandbox": "local", "max_turns": 2}, [SUM_TASK]),
    "agentrl/ToolUse-v0": ({}, [make_task(random.Random(i), k) for i, k in enumerate(("calc", "lookup_calc"))]),
}
SAMPLING = SamplingParams(max_new_tokens=40, temperature=1.0)
ENV_IDS = [pytest.param(e, marks=needs_root) if "Code" in e else e for e in ENVS]


@pytest.fixture
async def engine(tiny_server):
    async with RemoteEngine(tiny_server.url) as e:
        yield e


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(tiny_model_dir)


def sampled_runs(t) -> list[tuple[int, int]]:
    return sampled_spans(t.loss_mask)


async def replay(env_id, kwargs, row, t, renderer):
    """Play the trajectory's replies against a fresh env; check every prompt and return the env's
    rewards (one per reply) and whether it ended."""
    env = gymnasium.make(env_id, **kwargs).unwrapped
    try:
        obs, info = await env.areset(options={"task": copy.deepcopy(row)})
        messages, tools, rewards = list(obs), info.get("tools"), []
        for start, end in sampled_runs(t):
            assert renderer.decode(t.input_ids[:start]) == renderer.render(messages, tools)
            reply = renderer.decode(t.input_ids[start:end], skip_special_tokens=True)
            obs, reward, terminated, truncated, _ = await env.astep(reply)
            rewards.append(reward)
            messages += [{"role": "assistant", "content": reply}, *obs]
        return rewards, terminated or truncated
    finally:
        await env.aclose()


def check_tokens(t):
    assert t.status is TrajectoryStatus.OK, t.error
    assert t.num_sampled > 0
    for m, v, lp in zip(t.loss_mask, t.versions, t.logprobs, strict=True):
        assert (v == 0 and lp <= 0.0) if m else (v == NOT_SAMPLED and lp == 0.0)


@pytest.mark.parametrize("env_id", ENV_IDS)
async def test_single_turn_workflow_on_every_env(env_id, engine, renderer, tiny_model_dir):
    kwargs, rows = ENVS[env_id]
    wf = SingleTurnWorkflow(env_id, tiny_model_dir, SAMPLING, kwargs)
    try:
        results = await asyncio.gather(*(wf.arun_episode(engine, row) for row in rows))
        for row, trajectories in zip(rows, results, strict=True):
            [t] = trajectories
            check_tokens(t)
            assert t.num_turns == 1 and len(sampled_runs(t)) == 1
            rewards, ended = await replay(env_id, kwargs, row, t, renderer)
            assert t.reward == sum(rewards)
            assert ("truncated_by/workflow" in t.metrics) == (not ended)
    finally:
        await wf.aclose()


@pytest.mark.parametrize("env_id", ENV_IDS)
async def test_env_workflow_on_every_env_is_one_exact_token_stream(env_id, engine, renderer, tiny_model_dir):
    kwargs, rows = ENVS[env_id]
    wf = EnvWorkflow(env_id, tiny_model_dir, SAMPLING, kwargs, max_context_tokens=1024)
    try:
        results = await asyncio.gather(*(wf.arun_episode(engine, row) for row in rows))
        for row, trajectories in zip(rows, results, strict=True):
            [t] = trajectories  # the tiny template extends exactly: one segment per episode
            check_tokens(t)
            assert t.metrics["segments_per_episode"] == 1.0
            assert t.num_turns == len(sampled_runs(t)) == t.metrics["turns"]
            rewards, ended = await replay(env_id, kwargs, row, t, renderer)
            # each turn's env reward, and the trajectory's reward their sum (issue 48)
            assert t.turn_rewards == rewards and t.reward == pytest.approx(sum(rewards))
            assert ended or t.metrics["truncated_by/context"] == 1.0
    finally:
        await wf.aclose()


def agent_workflow(kind, env_id, kwargs, model_dir):
    if kind == "tool_agent":
        return ToolAgentWorkflow(env_id, model_dir, SAMPLING, kwargs, context_length=1024)
    return ExternalAgentWorkflow(AGENT, model_dir, env_id, kwargs, context_length=1024,
                                 extra_env={"AGENT_MAX_TOKENS": str(SAMPLING.max_new_tokens)})


@pytest.mark.parametrize("env_id", ENV_IDS)
@pytest.mark.parametrize("kind", ["tool_agent", "external_agent"])
async def test_agent_workflows_on_every_env(kind, env_id, engine, renderer, tiny_model_dir):
    """OpenAI-style agent code (in-process, and a subprocess through the gateway) trains on exact
    tokens: where its re-sent history renders as sampled (one segment), a replay of the replies
    against a fresh env gives every prompt and the reward; where it does not, each segment's
    prompt is a fresh rendering and each sampled token is trained once."""
    kwargs, rows = ENVS[env_id]
    rows = rows if kind == "tool_agent" else rows[:1]  # one agent process per env keeps the suite short
    wf = agent_workflow(kind, env_id, kwargs, tiny_model_dir)
    try:
        results = await asyncio.gather(*(wf.arun_episode(engine, row) for row in rows))
        for row, trajectories in zip(rows, results, strict=True):
            for t in trajectories:
                check_tokens(t)
                assert t.metrics["segments_per_episode"] == len(trajectories)
                for start, _ in sampled_runs(t):
                    assert renderer.decode(t.input_ids[:start]).endswith("<|assistant|>")
            assert sum(len(sampled_runs(t)) for t in trajectories) == trajectories[0].metrics["calls"]
            if len(trajectories) == 1:  # the history rendered as sampled, so a replay holds exactly
                [t] = trajectories
                rewards, _ = await replay(env_id, kwargs, row, t, renderer)
                assert t.reward == pytest.approx(sum(rewards))
                if kind == "tool_agent":  # a reply the env graded has its reward; a tool call 0
                    assert t.turn_rewards == rewards
    finally:
        await wf.aclose()


MCP_CALCULATOR = {"tools": [], "mcp_servers": [{"name": "calculator", "command": "python",
                                                 "args": [str(ROOT / "examples" / "mcp_calculator.py")],
                                                 "scope": "worker"}]}


@pytest.mark.parametrize("tools", ["python", "mcp"])
async def test_the_tool_agent_runs_the_envs_tools_between_calls(tools, engine, renderer, tiny_model_dir):
    """Greedy on calculator tasks: the trained model calls the tool (a Python function, or the
    same calculator from an MCP server), the agent runs it through the env's own tool path and
    sends the result back as a tool message, the model answers; one exact stream per episode,
    rewarded as the env rewards the same replies in its own loop (its counts of calls and
    errors included)."""
    kwargs = {"kinds": ["calc"], **(MCP_CALCULATOR if tools == "mcp" else {})}
    wf = ToolAgentWorkflow("agentrl/ToolUse-v0", tiny_model_dir, {"max_new_tokens": 100, "temperature": 0.0}, kwargs)
    rows = [make_task(random.Random(100 + i), "calc") for i in range(6)]
    results = await asyncio.gather(*(wf.arun_episode(engine, row) for row in rows))
    called = [(row, t) for row, [t] in zip(rows, results, strict=True) if t.metrics["tool_calls"] >= 1]
    assert called, [renderer.decode(t.input_ids) for [t] in results]
    for row, t in called:
        assert t.num_turns >= 2 and t.metrics["segments_per_episode"] == 1.0
        rewards, ended = await replay("agentrl/ToolUse-v0", kwargs, row, t, renderer)
        assert ended and t.reward == sum(rewards) and t.turn_rewards == rewards
    await wf.aclose()


class StepRewardsEnv(gymnasium.Env):
    """A plain Gymnasium env that rewards every reply (the shipped envs score only the last step):
    three turns, each reply earns a number drawn from its text (a checksum, so only equal replies
    earn equal rewards), and each turn's state is its step (``info["state_key"]``), so every sample
    of a task shares its turns' states."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return [{"role": "user", "content": "Say anything."}], {"state_key": "step-0"}

    def step(self, action):
        self.steps += 1
        return ([{"role": "user", "content": "Again."}], step_reward(action), self.steps == 3, False,
                {"state_key": f"step-{self.steps}"})


def step_reward(reply: str) -> float:
    return zlib.crc32(reply.encode()) % 1000 / 1000


@pytest.fixture
def step_rewards_env():
    """``test/StepRewards-v0`` registered for one test (registered at import, it was in the registry
    of every test module collected with this one: tests/envs/test_env_api.py lists the registry)."""
    gymnasium.register("test/StepRewards-v0", entry_point=StepRewardsEnv)
    yield "test/StepRewards-v0"
    gymnasium.registry.pop("test/StepRewards-v0", None)


async def test_every_turn_s_env_reward_reaches_the_turn_level_estimator(engine, renderer, tiny_model_dir,
                                                                         step_rewards_env):
    """Issue 48: no built-in workflow filled ``turn_rewards``, so ``advantages.kind: turn`` put the
    whole return on the last turn. Sampled episodes of an env that rewards each reply: each turn
    carries its reply's reward, the trajectory's reward is their sum, and the turn estimator's
    advantages change from turn to turn within an episode."""
    from agentrl.trainer.advantages import shaped_rewards
    from agentrl.trainer.batch import prepare_batch
    from agentrl.trainer.trainer_config import AdvantageConfig, TrainerConfig
    from agentrl.trainer.turns import per_turn_rewards, turn_advantages

    wf = EnvWorkflow(step_rewards_env, tiny_model_dir, {"max_new_tokens": 6, "temperature": 1.0}, turn_states=True)
    try:
        results = await asyncio.gather(*(wf.arun_episode(engine, {}) for _ in range(8)))
    finally:
        await wf.aclose()
    trajectories = [t for [t] in results]
    for t in trajectories:
        check_tokens(t)
        replies = [renderer.decode(t.input_ids[a:b], skip_special_tokens=True) for a, b in sampled_runs(t)]
        assert t.turn_rewards == [step_reward(r) for r in replies] and len(replies) == 3
        assert t.reward == pytest.approx(sum(t.turn_rewards)) and t.turn_states == ["step-0", "step-1", "step-2"]
        # the documented convention: the turns' rewards sum to the reward, nothing left for the last
        assert per_turn_rewards(t.loss_mask, t.reward, t.turn_rewards) == pytest.approx(t.turn_rewards)
        t.group_id = "task"
    config = TrainerConfig(advantages=AdvantageConfig(kind="turn", turn_weight=1.0))
    batch = prepare_batch(trajectories, version=0, config=config)
    per_turn = [[float(seq["advantages"][a]) for a, _ in sampled_runs(t)] for seq, t in zip(batch.sequences, trajectories, strict=True)]
    assert batch.stats["adv/turns_grouped_frac"] == 1.0
    # credit differs between the turns of an episode (the checksum rewards tie only on equal replies)
    assert any(len(set(a)) > 1 for a in per_turn), (per_turn, [t.turn_rewards for t in trajectories])
    # without the turn rewards every turn of an episode would get the same advantage
    flat = [dataclasses.replace(t, turn_rewards=None) for t in trajectories]
    shaped = shaped_rewards([t.reward for t in flat], [t.num_sampled for t in flat], config=config.advantages)[0]
    without, _ = turn_advantages(flat, [0.0] * len(flat), shaped.tolist(), config.advantages)
    assert all(len({float(a[s]) for s, _ in sampled_runs(t)}) == 1 for a, t in zip(without, flat, strict=True))


async def test_an_external_agent_that_crashes_or_hangs_is_failed_data(engine, tiny_model_dir, tmp_path):
    crash = tmp_path / "crash.py"
    crash.write_text("import sys\nprint('bad things', file=sys.stderr)\nsys.exit(3)\n")
    wf = ExternalAgentWorkflow([sys.executable, str(crash)], tiny_model_dir, "agentrl/Arith-v0")
    [t] = await wf.arun_episode(engine, generate_problems(1, seed=5)[0].to_row())
    assert t.status is TrajectoryStatus.ENV_ERROR and "code 3" in t.error and "bad things" in t.error
    await wf.aclose()
    hang = tmp_path / "hang.py"
    hang.write_text("import time\ntime.sleep(60)\n")
    wf = ExternalAgentWorkflow([sys.executable, str(hang)], tiny_model_dir, timeout_s=1.0)
    [t] = await wf.arun_episode(engine, {"question": "anything"})
    assert t.status is TrajectoryStatus.TIMEOUT and "budget" in t.error
    await wf.aclose()


async def test_a_multi_turn_episode_takes_tool_results_between_replies(engine, renderer, tiny_model_dir):
    """ToolUse with the calculator: the trained model calls it, gets the result, answers."""
    wf = EnvWorkflow("agentrl/ToolUse-v0", tiny_model_dir, {"max_new_tokens": 100, "temperature": 0.0},
                     {"kinds": ["calc"]})
    rows = [make_task(random.Random(100 + i), "calc") for i in range(6)]
    results = await asyncio.gather(*(wf.arun_episode(engine, row) for row in rows))
    called = [t for [t] in results if t.num_turns >= 2 and t.metrics["reward/tool_errors"] == 0]
    assert called, [renderer.decode(t.input_ids) for [t] in results]
    for t in called:
        (_, end1), (start2, _) = sampled_runs(t)[:2]
        assert renderer.decode(t.input_ids[end1 - 1:end1]) == "<|end|>"  # the stop token, as sampled
        between = renderer.decode(t.input_ids[end1:start2])  # the tool result: context, not trained
        assert between.startswith("<|tool|>") and between.endswith("<|end|><|assistant|>")
    await wf.aclose()


async def test_envs_are_reused_across_episodes(engine, tiny_model_dir):
    wf = SingleTurnWorkflow("agentrl/Arith-v0", tiny_model_dir, {"max_new_tokens": 8})
    rows = [p.to_row() for p in generate_problems(8, seed=3)]
    for _ in range(3):
        results = await asyncio.gather(*(wf.arun_episode(engine, row) for row in rows))
        assert all(t.status is TrajectoryStatus.OK for [t] in results)
    assert wf.envs.built <= len(rows)
    await wf.aclose()


async def test_failures_come_back_as_data(engine, tiny_model_dir):
    wf = EnvWorkflow("agentrl/Arith-v0", tiny_model_dir, {"max_new_tokens": 8})
    [t] = await wf.arun_episode(engine, {"question": "What is 1+1?"})  # no answer: the env refuses the row
    assert t.status is TrajectoryStatus.ENV_ERROR and "answer" in t.error and len(t) == 0
    async with RemoteEngine(f"http://127.0.0.1:{free_port()}", max_retries=0, backoff=0.01,
                            health_check_interval=0.01) as dead:
        [t] = await wf.arun_episode(dead, {"question": "What is 1+1?", "answer": "2"})
    assert t.status is TrajectoryStatus.INFERENCE_ERROR and "server" in t.error
    slow = EnvWorkflow("agentrl/Arith-v0", tiny_model_dir, {"max_new_tokens": 8}, timeout_s=1e-4)
    [t] = await slow.arun_episode(engine, {"question": "What is 1+1?", "answer": "2"})
    assert t.status is TrajectoryStatus.TIMEOUT and "budget" in t.error
    # a good episode after the failures: the failed envs were dropped, not reused half-done
    [t] = await wf.arun_episode(engine, {"question": "What is 1+1?", "answer": "2"})
    assert t.status is TrajectoryStatus.OK
    await wf.aclose()
    await slow.aclose()


async def test_the_context_budget_truncates_the_episode(engine, tiny_model_dir):
    wf = EnvWorkflow("agentrl/ToolUse-v0", tiny_model_dir, {"max_new_tokens": 100, "temperature": 0.0},
                     {"kinds": ["calc"]}, max_context_tokens=120)
    [t] = await wf.arun_episode(engine, make_task(random.Random(7), "calc"))
    assert t.status is TrajectoryStatus.OK and len(t) <= 120 and t.num_turns == 1
    assert t.metrics["truncated_by/context"] == 1.0 and t.reward == 0.0
    [t] = await wf.arun_episode(engine, {**make_task(random.Random(7), "calc"), "question": "x" * 200})
    assert t.status is TrajectoryStatus.ENV_ERROR and "max_context_tokens" in t.error
    await wf.aclose()


async def test_a_template_that_rewrites_history_splits_segments_instead_of_retokenizing(engine, tiny_model_dir):
    """Like Qwen3's template dropping earlier <think>: this one drops the text of every assistant
    turn but the last. Each call then starts a segment; sampled tokens are trained once, as sampled."""
    tok = copy.deepcopy(load_tokenizer(tiny_model_dir))
    tok.chat_template = CHAT_TEMPLATE.replace("<|assistant|>{{ m['content'] or '' }}",
                                              "<|assistant|>{{ (m['content'] or '') if loop.last else '' }}")
    renderer = ChatRenderer(tok)
    wf = EnvWorkflow("agentrl/ToolUse-v0", tok, {"max_new_tokens": 100, "temperature": 0.0}, {"kinds": ["calc"]})
    rows = [make_task(random.Random(100 + i), "calc") for i in range(6)]
    results = await asyncio.gather(*(wf.arun_episode(engine, row) for row in rows))
    split = [ts for ts in results if len(ts) >= 2]
    assert split, "no episode took two turns"
    for ts in split:
        assert all(t.metrics["segments_per_episode"] == len(ts) and t.num_turns == 1 for t in ts)
        assert len({t.reward for t in ts}) == 1  # every segment carries the episode's return
        for t in ts:
            [(start, _)] = sampled_runs(t)
            prompt_text = renderer.decode(t.input_ids[:start])
            assert renderer.encode(prompt_text) == t.input_ids[:start]  # a fresh prompt, rendered whole
        later = renderer.decode(ts[1].input_ids[:sampled_runs(ts[1])[0][0]])
        assert "<|assistant|><|end|><|tool|>" in later  # the template's view of history, not what was sampled
    await wf.aclose()


async def test_env_workflow_names_the_state_of_each_turn(engine, tiny_model_dir):
    """turn_states=True: one key per turn (the turn-level estimator's step groups); greedy replies to
    one task pass through the same states, another task starts elsewhere."""
    wf = EnvWorkflow("agentrl/ArithRetry-v0", tiny_model_dir, {"max_new_tokens": 8, "temperature": 0.0},
                     {"max_attempts": 3}, turn_states=True)
    rows = [p.to_row() for p in generate_problems(2, seed=5)]
    try:
        [a], [b], [c] = await asyncio.gather(*(wf.arun_episode(engine, row) for row in (rows[0], rows[0], rows[1])))
    finally:
        await wf.aclose()
    for t in (a, b, c):
        assert t.status is TrajectoryStatus.OK and len(t.turn_states) == t.num_turns == len(sampled_spans(t.loss_mask))
        assert len(set(t.turn_states)) == t.num_turns  # each turn answered a longer conversation
    assert max(t.num_turns for t in (a, b, c)) > 1  # the tiny model is wrong most of the time: retries
    assert a.turn_states == b.turn_states and a.turn_states[0] != c.turn_states[0]
    # the env's own key wins over the digest of the conversation
    assert state_key({"state_key": "room-3"}, [{"role": "user", "content": "hi"}], None) == "room-3"
    assert state_key({}, [{"role": "user", "content": "hi"}], None).startswith("history:")

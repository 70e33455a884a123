"""The trained tiny demo model plays Arith-v0 and ToolUse-v0 (calculator only) through the
envs' own prompts: proof that the envs show the model exactly what it was trained on."""

from __future__ import annotations

from pathlib import Path

import gymnasium
import pytest

import envs  # noqa: F401

MODEL = Path(__file__).resolve().parents[2] / "examples" / "tiny-model"
pytestmark = pytest.mark.skipif(not (MODEL / "config.json").is_file(),
                                reason="the trained tiny model is not in examples/tiny-model yet")
EPISODES = 60


@pytest.fixture(scope="module")
def tiny():
    import torch

    from agentrl.model.tinymodel import load_model

    torch.set_num_threads(1)
    return load_model(MODEL)


def render(tok, messages, tools=None) -> list[int]:
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def test_arith_prompts_match_training(tiny):
    from agentrl.model.tinymodel import greedy_complete

    model, tok = tiny
    env = gymnasium.make("agentrl/Arith-v0")
    prompts = [render(tok, env.reset(seed=s)[0]) for s in range(EPISODES)]
    replies = greedy_complete(model, tok, prompts, max_new_tokens=16)
    rewards = []
    for s, reply in enumerate(replies):
        env.reset(seed=s)
        rewards.append(env.step(reply)[1])
    env.close()
    assert sum(rewards) / EPISODES >= 0.1, replies[:5]  # an untrained model scores ~0


def test_tool_use_calculator_episodes(tiny):
    """Every first reply (a call, a malformed call or an answer) is handled as data, and the env
    scores the model as its build measured it (build_info.json): well-formed calls at the
    build's ``tool_call_rate`` get a tool result back, and the two-turn episodes are solved at
    the build's ``tool_accuracy`` (the committed model calls the calculator but does not copy
    the question into the call, so both numbers say so), each within 0.2."""
    import json

    from agentrl.model.tinymodel import greedy_complete

    model, tok = tiny
    info = json.loads((MODEL / "build_info.json").read_text())
    env = gymnasium.make("agentrl/ToolUse-v0", kinds=["calc"])
    firsts = []
    for s in range(EPISODES):
        obs, reset_info = env.reset(seed=s)
        firsts.append(render(tok, obs, reset_info["tools"]))
    tools = reset_info["tools"]
    calls = greedy_complete(model, tok, firsts, max_new_tokens=96)
    seconds, alive = [], []
    for s, reply in enumerate(calls):
        env.reset(seed=s)
        obs, _, terminated, truncated, step_info = env.step(reply)
        assert not truncated and (terminated or (obs and all(m["role"] == "tool" for m in obs)))
        if not terminated and step_info["tool_errors"] == 0:
            seconds.append(render(tok, env.unwrapped.transcript, tools))
            alive.append(s)
    assert abs(len(alive) / EPISODES - info["tool_call_rate"]) <= 0.2, calls[:3]
    answers = greedy_complete(model, tok, seconds, max_new_tokens=16)
    rewards = []
    for s, answer in zip(alive, answers, strict=True):
        env.reset(seed=s)
        env.step(calls[s])
        obs, reward, terminated, truncated, _ = env.step(answer)
        assert terminated and not truncated and obs == [] and reward in (0.0, 1.0)
        rewards.append(reward)
    env.close()
    assert abs(sum(rewards) / EPISODES - info["tool_accuracy"]) <= 0.2, answers[:5]

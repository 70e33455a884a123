"""TextArena's games, unchanged, as ``textarena/<Game-vN>``: a single-player game and a two-player
game in self-play (each seat its own token stream and trajectory with its seat's reward) and
against a fixed opponent, played by the tiny model through a real ``agentrl serve``.

The bug stories: self-play that trains both seats on one conversation (seat 1 learning from
seat 0's prompt and reward); a reward that is not the game's when the episode is replayed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium
import pytest

from agentrl.api import SamplingParams, TrajectoryStatus, sampled_spans
from agentrl.client.remote_engine import RemoteEngine
from agentrl.env.checks import check_text_env
from agentrl.errors import ConfigError
from agentrl.plugins import find_env
from envs.interop.textarena_env import EVAL_SEED, eval_rows, train_rows
from workflows.env import EnvWorkflow
from workflows.self_play import SelfPlayWorkflow

from ..short_runs import short_train

AGENTRL = str(Path(sys.executable).parent / "agentrl")
SAMPLING = SamplingParams(max_new_tokens=12, temperature=1.0)


def replies(wf, traj) -> list[str]:
    return [wf.renderer.decode(traj.input_ids[a:b], skip_special_tokens=True) for a, b in sampled_spans(traj.loss_mask)]


def test_envs_check_passes_on_a_single_and_a_two_player_game():
    r = subprocess.run([AGENTRL, "envs", "check", "textarena/GuessTheNumber-v0"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("textarena/GuessTheNumber-v0: ok"), r.stdout + r.stderr
    assert check_text_env("textarena/TicTacToe-v0") == []


def test_games_that_cannot_run_here_say_why():
    with pytest.raises(ConfigError, match="did you mean 'textarena/TicTacToe-v0'"):
        find_env("textarena/TicTacToe-v9")
    with pytest.raises(Exception, match="needs Python >= 3.12"):  # f-strings of 3.12 in its code
        gymnasium.make(find_env("textarena/Chess-v0"))
    with pytest.raises(Exception, match="needs an API key"):  # its jury is a remote model
        gymnasium.make(find_env("textarena/Debate-v0"))
    assert {r["seed"] for r in train_rows(0)}.isdisjoint(r["seed"] for r in eval_rows(0))
    assert min(r["seed"] for r in eval_rows(0)) == EVAL_SEED


async def test_a_single_player_game_through_a_real_server(tiny_server, tiny_model_dir):
    wf = EnvWorkflow(find_env("textarena/GuessTheNumber-v0"), tiny_model_dir, SAMPLING, {"max_turns": 3},
                     max_context_tokens=1024)
    async with RemoteEngine(tiny_server.url) as engine:
        for seed in (1, 2):
            (traj,) = await wf.arun_episode(engine, {"seed": seed})
            assert traj.status == TrajectoryStatus.OK, traj.error
            env = gymnasium.make("textarena/GuessTheNumber-v0", max_turns=3).unwrapped
            obs, _ = env.reset(options={"task": {"seed": seed}})
            assert "[GAME]" in obs[0]["content"] and "number" in obs[0]["content"]
            for reply in replies(wf, traj):  # the game replayed on the same moves gives the same reward
                _, reward, terminated, truncated, _ = env.step(reply)
            assert (terminated or truncated) and traj.reward == reward
            env.close()


async def test_two_player_self_play_gives_each_seat_its_own_trajectory(tiny_server, tiny_model_dir):
    wf = SelfPlayWorkflow("textarena/IteratedPrisonersDilemma-v0", tiny_model_dir, SAMPLING, {"max_turns": 4},
                          max_context_tokens=1024)
    async with RemoteEngine(tiny_server.url) as engine:
        trajs = await wf.arun_episode(engine, {"seed": 4})
    assert [t.status for t in trajs] == [TrajectoryStatus.OK] * 2, [t.error for t in trajs]
    assert [t.metrics["seat"] for t in trajs] == [0.0, 1.0]
    text = [wf.renderer.decode(t.input_ids) for t in trajs]
    assert "You are Player 0" in text[0] and "You are Player 1" not in text[0]
    assert "You are Player 1" in text[1] and "You are Player 0" not in text[1]
    # replay: the same moves, seat by seat, through the env give the seat rewards the trajectories carry
    moves = {0: replies(wf, trajs[0]), 1: replies(wf, trajs[1])}
    env = gymnasium.make("textarena/IteratedPrisonersDilemma-v0", max_turns=4).unwrapped
    _, info = env.reset(options={"task": {"seed": 4}})
    seat, done = info["seat"], False
    while not done:
        _, _, terminated, truncated, info = env.step(moves[seat].pop(0))
        done, seat = terminated or truncated, info.get("seat", seat)
    assert moves == {0: [], 1: []}
    seat_rewards = info.get("seat_rewards") or {0: 0.0, 1: 0.0}
    assert [t.reward for t in trajs] == [seat_rewards[0], seat_rewards[1]]
    env.close()
    # the one-conversation workflow refuses a self-play game instead of mixing the seats
    (failed,) = await EnvWorkflow("textarena/TicTacToe-v0", tiny_model_dir, SAMPLING).arun_episode(None, {"seed": 4})
    assert failed.status == TrajectoryStatus.ENV_ERROR and "SelfPlayWorkflow" in failed.error


async def test_a_fixed_opponent_takes_a_seat(tiny_server, tiny_model_dir):
    kwargs = {"opponents": {"1": "scripted:[4]"}, "max_turns": 4}
    wf = EnvWorkflow("textarena/TicTacToe-v0", tiny_model_dir, SAMPLING, kwargs, max_context_tokens=1024)
    async with RemoteEngine(tiny_server.url) as engine:
        (traj,) = await wf.arun_episode(engine, {"seed": 5})
    assert traj.status == TrajectoryStatus.OK, traj.error
    assert "You are Player 0" in wf.renderer.decode(traj.input_ids)
    env = gymnasium.make("textarena/TicTacToe-v0", **kwargs).unwrapped
    env.reset(options={"task": {"seed": 5}})
    for reply in replies(wf, traj):
        _, reward, *_ = env.step(reply)
    assert traj.reward == reward
    env.close()


def test_a_short_self_play_train(tmp_path):
    """Two seats' trajectories per game flow through the executor and the trainer (`agentrl train`)."""
    import json

    short_train(tmp_path / "run", {
        "workflow": "workflows.self_play:SelfPlayWorkflow",
        "workflow_args": {"env_id": "textarena/IteratedPrisonersDilemma-v0", "env_kwargs": {"max_turns": 4},
                          "max_context_tokens": 1024},
        "dataset": "envs.interop.textarena_env:train_rows", "group_size": 2, "batch_size": 2,
        "sampling": {"temperature": 1.0, "max_new_tokens": 12}})
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/trajectories" in r]
    assert all(r["rollout/trajectories"] == 2 * 2 * 2 for r in steps), steps  # 2 games x 2 groups x 2 seats

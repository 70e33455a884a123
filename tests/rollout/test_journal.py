"""The episode log: finished generations are replayed, interrupted ones continue from their last
token, a changed prompt is generated afresh, and the file survives a crash and compaction.
A scripted InferenceClient stands in for the server (unit tests of the replay logic)."""

from __future__ import annotations

import dataclasses

from agentrl.api import Completion, SamplingParams, Trajectory
from agentrl.rollout.journal import EpisodeLog, ReplayClient, call_digest

SP = SamplingParams(max_new_tokens=6, temperature=1.0)


class Scripted:
    """Generates tokens 100, 101, ...; reports an interruption after ``interrupt_after`` tokens."""

    def __init__(self, interrupt_after: int | None = None, version: int = 0):
        self.calls: list[tuple[list[int], SamplingParams]] = []
        self.interrupt_after, self.version = interrupt_after, version

    async def generate(self, input_ids, sampling, *, on_progress=None):
        self.calls.append((list(input_ids), sampling))
        n = sampling.max_new_tokens
        toks = list(range(100, 100 + n))
        if self.interrupt_after is not None and on_progress is not None:
            k = self.interrupt_after
            on_progress(Completion(toks[:k], [-0.5] * k, [self.version] * k, "abort"))
        return Completion(toks, [-0.5] * n, [self.version] * n, "length")


async def test_new_calls_are_generated_and_logged_then_replayed(tmp_path):
    log = EpisodeLog(tmp_path / "ep.jsonl")
    engine = Scripted()
    first = await ReplayClient(engine, log, "0:0").generate([1, 2], SP)
    second = await ReplayClient(engine, log, "0:1").generate([1, 2], SP)
    assert len(engine.calls) == 2 and first.tokens == list(range(100, 106))
    log.close()

    again = EpisodeLog(tmp_path / "ep.jsonl")  # a resumed run reads the file
    engine2 = Scripted()
    client = ReplayClient(engine2, again, "0:0")
    assert await client.generate([1, 2], SP) == first and engine2.calls == []
    assert client.replayed_tokens == 6
    assert (await ReplayClient(engine2, again, "0:1").generate([1, 2], SP)) == second
    # a third call of episode 0:0 was never made: it goes to the engine
    await client.generate([1, 2, *first.tokens, 7], SP)
    assert len(engine2.calls) == 1
    again.close()


async def test_an_interrupted_call_continues_from_its_last_logged_token(tmp_path):
    log = EpisodeLog(tmp_path / "ep.jsonl")
    digest = call_digest([1, 2], SP)
    partial = Completion([100, 101], [-0.1, -0.2], [3, 3], "abort")
    log.record_call("5:0", 0, digest, partial, partial=True)
    engine = Scripted(version=4)
    out = await ReplayClient(engine, log, "5:0").generate([1, 2], SP)
    prompt, sampling = engine.calls[0]
    assert prompt == [1, 2, 100, 101] and sampling.max_new_tokens == 4
    assert out.tokens == [100, 101, 100, 101, 102, 103]
    assert out.versions == [3, 3, 4, 4, 4, 4] and out.logprobs[:2] == [-0.1, -0.2]  # kept as sampled
    log.close()


async def test_progress_reports_are_logged_as_partial(tmp_path):
    log = EpisodeLog(tmp_path / "ep.jsonl")
    await ReplayClient(Scripted(interrupt_after=3), log, "1:0").generate([9], SP)
    log.close()
    lines = (tmp_path / "ep.jsonl").read_text().splitlines()
    assert len(lines) == 2 and '"partial":true' in lines[0] and '"partial":false' in lines[1]


async def test_a_changed_prompt_or_sampling_is_generated_afresh(tmp_path):
    log = EpisodeLog(tmp_path / "ep.jsonl")
    await ReplayClient(Scripted(), log, "2:0").generate([1, 2], SP)
    engine = Scripted()
    await ReplayClient(engine, log, "2:0").generate([1, 3], SP)
    await ReplayClient(engine, log, "2:0").generate([1, 2], dataclasses.replace(SP, temperature=0.5))
    assert len(engine.calls) == 2
    log.close()


async def test_finished_episodes_forget_and_compaction(tmp_path):
    path = tmp_path / "ep.jsonl"
    log = EpisodeLog(path)
    t = Trajectory([1, 2], [0, 1], [0.0, -1.0], [-1, 0], reward=1.0)
    log.record_episode("3:0", [t])
    log.record_episode("4:0", [t])
    await ReplayClient(Scripted(), log, "9:0").generate([1], SP)
    log.forget(["4:0"])
    assert log.finished("3:0")[0].to_dict() == t.to_dict() and log.finished("4:0") is None
    log.compact()
    log.close()
    assert len(path.read_text().splitlines()) == 2  # 3:0's episode and 9:0's call
    with path.open("a") as f:
        f.write('{"kind": "episode", "key": "7:0", "traj')  # a line cut short by a crash
    kept = EpisodeLog(path, keep=lambda key: key != "9:0")
    assert kept.keys() == {"3:0"}
    kept.close()

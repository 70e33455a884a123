"""The teacher of on-policy distillation against a real ``agentrl serve`` (agentrl.rollout.teacher):
with the teacher the student itself, the teacher's log-probability of every sampled token is the
one the engine sampled it with (reverse KL 0 on every token); a teacher of another tokenizer is
refused before the first request; a teacher that is down leaves failed trajectories, not a crash."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from agentrl.api import SamplingParams, Trajectory, TrajectoryStatus
from agentrl.client import RemoteEngine
from agentrl.errors import ConfigError
from agentrl.rollout.teacher import Teacher
from agentrl.trainer.distill import TeacherConfig

PROMPT = "<|user|>Q: 17+25+40=?<|assistant|>"


async def _samples(url: str, tokenizer, n: int) -> list[Trajectory]:
    prompt = tokenizer.encode(PROMPT)
    async with RemoteEngine(url, engine="agentrl") as engine:
        outs = await engine.generate_group(prompt, SamplingParams(max_new_tokens=12, temperature=1.0, seed=3), n)
    return [Trajectory(prompt + c.tokens, [0] * len(prompt) + [1] * len(c.tokens), [0.0] * len(prompt) + c.logprobs,
                       [-1] * len(prompt) + c.versions, group_id="g") for c in outs]


def test_the_student_as_its_own_teacher_gives_reverse_kl_zero_on_every_token(tiny_server, tiny_model_dir):
    from agentrl.rollout.renderer import load_tokenizer

    async def main():
        trajectories = await _samples(tiny_server.url, load_tokenizer(tiny_model_dir), 4)
        teacher = Teacher(TeacherConfig(url=tiny_server.url, engine="agentrl"), str(tiny_model_dir))
        try:
            await teacher.check_tokenizer()
            await teacher.score(trajectories)
        finally:
            await teacher.aclose()
        return trajectories, teacher.metrics()

    trajectories, metrics = asyncio.run(main())
    assert metrics["teacher/scored"] == 4 and metrics["teacher/failed"] == 0
    for t in trajectories:
        assert t.teacher_logprobs is not None and len(t.teacher_logprobs) == len(t)
        for m, behaviour, teacher in zip(t.loss_mask, t.logprobs, t.teacher_logprobs, strict=True):
            if m:  # the same weights score the token the engine sampled: the same number, up to float rounding
                assert teacher == pytest.approx(behaviour, abs=1e-4)
            else:
                assert teacher == 0.0
        # the row survives the trip every batch takes (to_dict, the ranks' broadcast, the journal)
        assert Trajectory.from_dict(json.loads(json.dumps(t.to_dict()))).teacher_logprobs == t.teacher_logprobs


def test_a_teacher_with_another_tokenizer_is_refused(tiny_server, tiny_model_dir, tmp_path):
    student = tmp_path / "student"  # the tiny model's tokenizer with the digits 1 and 2 swapped
    shutil.copytree(tiny_model_dir, student, ignore=shutil.ignore_patterns("*.safetensors"))
    tok = json.loads((student / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["1"], vocab["2"] = vocab["2"], vocab["1"]
    (student / "tokenizer.json").write_text(json.dumps(tok))

    async def main():
        teacher = Teacher(TeacherConfig(url=tiny_server.url), str(student))
        try:
            await teacher.check_tokenizer()
        finally:
            await teacher.aclose()

    with pytest.raises(ConfigError, match="tokenizes differently from the student"):
        asyncio.run(main())


def test_a_teacher_that_is_down_fails_the_trajectories_not_the_run(tiny_model_dir):
    t = Trajectory([5, 6, 7], [0, 1, 1], [0.0, -1.0, -1.0], [-1, 0, 0], group_id="g")

    async def main():
        teacher = Teacher(TeacherConfig(url="http://127.0.0.1:9", engine="agentrl", max_retries=1, timeout_s=5),
                          str(tiny_model_dir))
        teacher.engine.backoff = 0.01
        try:
            await teacher.score([t])
        finally:
            await teacher.aclose()

    asyncio.run(main())
    assert t.status is TrajectoryStatus.INFERENCE_ERROR and "the teacher could not score it" in t.error

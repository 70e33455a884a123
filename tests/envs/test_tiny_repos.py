"""Tiny repositories (envs/repo/tiny_repos.py) and the software-engineering example's scripted agents
(examples/swe_agent.py): generation is deterministic and its bugs are real; the rows' ``files`` become
the commit the row names; and in real containers of agentrl/Repo-v0 the good scripted agent resolves
its repository under the hidden tests, reading exactly the observations its SFT conversations hold
(the pytest time aside), and so does the one that fixes it without running the tests, while the
agent that submits at once and the one that breaks another function do not.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path

import pytest

from envs.repo import tiny_repos
from envs.repo.env import RepoEnv
from envs.repo.tasks import FILES_COMMIT
from examples import swe_agent


def test_the_same_seed_makes_the_same_repository_and_the_splits_never_meet():
    assert tiny_repos.instance(7, "img") == tiny_repos.instance(7, "img")
    train, held = tiny_repos.instances(30, "train", "img"), tiny_repos.instances(10, "heldout", "img")
    compositions = lambda rows: {tuple(sorted(re.findall(r"^def (\w+)", r["fixed"], re.M))) for r in rows}  # noqa: E731
    assert not compositions(train) & compositions(held)
    assert {r["split"] for r in train} == {"train"} and {r["split"] for r in held} == {"heldout"}
    assert {r["strategy"] for r in train} <= {*tiny_repos.SWESMITH_KINDS, "flip_comparison"}
    with pytest.raises(Exception, match="split must be 'train' or 'heldout'"):
        tiny_repos.instances(1, "test", "img")


def test_each_bug_is_one_line_that_the_visible_and_the_hidden_test_of_its_function_catch():
    for row in tiny_repos.instances(25, "train", "img"):
        buggy, fixed = row["files"]["calc.py"].split("\n"), row["fixed"].split("\n")
        assert sum(a != b for a, b in zip(buggy, fixed, strict=True)) == 1
        scope: dict = {}
        exec(row["fixed"], scope)
        for name in re.findall(r"^def (\w+)", row["fixed"], re.M):  # the visible tests pass on the fixed module
            asserts = re.findall(rf"assert ({name}\(.*\)) == (.+)$", row["files"]["test_calc.py"], re.M)
            assert len(asserts) == 2 and all(repr(eval(c, scope)) == v for c, v in asserts)
        # the failure the good agent reads names the broken function
        assert swe_agent.failing_assert(row, row["function"]).startswith(("assert", "ZeroDivisionError"))
        assert json.loads(row["FAIL_TO_PASS"]) == [f"test_calc.py::test_{row['function']}"]
        assert len(json.loads(row["PASS_TO_PASS"])) == 2


def test_files_commit_is_the_commit_git_makes_of_the_files(tmp_path):
    row = tiny_repos.instance(3, "img")
    for name, text in row["files"].items():
        (tmp_path / name).write_text(text)
    out = subprocess.run(["sh", "-c", FILES_COMMIT, "sh", *sorted(row["files"])], cwd=tmp_path, capture_output=True,
                         text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == row["base_commit"] == tiny_repos.files_commit(row["files"])


def test_scripted_conversations_fit_the_tiny_models_context():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(Path(__file__).resolve().parents[2] / "examples" / "tiny-model")
    longest = max(len(tok(tok.apply_chat_template(c["messages"], tools=c["tools"], tokenize=False),
                          add_special_tokens=False)["input_ids"]) for c in swe_agent.sft_conversations(0, 60))
    assert longest <= 1024 - 64, longest  # the last reply has room to spare too


def _time_free(text: str) -> str:
    return re.sub(r" in \d+\.\d+s", " in Xs", text)


async def _play(row: dict, agent: str) -> tuple[list[str], list[str], dict]:
    """The scripted ``agent``'s replies played in Repo-v0: what the container answered, what the SFT
    conversation says it answers, and the last step's info."""
    conv = swe_agent.conversation(row, agent, __import__("random").Random(0))
    env = RepoEnv(**swe_agent.ENV_KWARGS)
    try:
        obs, info = await env.areset(options={"task": row})
        assert obs[0]["content"] == conv["messages"][0]["content"] and info["tools"] == conv["tools"]
        seen, scripted, last = [], [], {}
        for msg in conv["messages"][1:]:
            if msg["role"] == "tool":
                scripted.append(msg["content"])
                continue
            call = msg["tool_calls"][0]["function"]
            reply = f"<tool_call>{json.dumps({'name': call['name'], 'arguments': json.loads(call['arguments'])})}</tool_call>"
            out, reward, done, _, last = await env.astep(reply)
            seen += [m["content"] for m in out]
        assert done
        return seen, scripted, last
    finally:
        await env.aclose()


def test_the_scripted_agents_in_real_containers(docker_ready):
    row = tiny_repos.instances(1, "heldout", tiny_repos.image())[0]

    async def main():
        return await asyncio.gather(*[_play(row, agent) for agent in (swe_agent.GOOD, swe_agent.RUSHED,
                                                                       swe_agent.WRONG, swe_agent.BLIND)])

    (good_seen, good_scripted, good), (_, _, rushed), (wrong_seen, wrong_scripted, wrong), \
        (blind_seen, blind_scripted, blind) = asyncio.run(main())
    for seen, scripted in ((good_seen, good_scripted), (wrong_seen, wrong_scripted), (blind_seen, blind_scripted)):
        assert [_time_free(t) for t in seen] == [_time_free(t) for t in scripted]  # grep -n, cat -n, sed as scripted
    assert good["resolved"] and good["ran_tests"] == 1.0 and good["rewards"]["resolved"] == 1.0, good
    removed = [line for line in good["diff"].splitlines() if line.startswith("-") and not line.startswith("---")]
    assert len(removed) == 1 and "test_calc.py" not in good["diff"], good["diff"]  # the one line; no test file
    assert not rushed["resolved"] and rushed["ran_tests"] == 0.0 and not rushed["patch_applied"], rushed
    assert not wrong["resolved"] and wrong["patch_applied"] and wrong["ran_tests"] == 1.0, wrong
    assert blind["resolved"] and blind["ran_tests"] == 0.0, blind

"""`agentrl tasks` with real Docker: instances generated from a real package (inflection 0.5.1's
sdist from PyPI, its own pytest suite) by swesmith's procedural rewrites, validated by the env's
grading, played by the oracle agent in both formats, and the same again from the same seed.

One session fixture generates a handful (seed 0, two candidates); the repository image shares
its apt layer with `make repo-images`' (the same Dockerfile lines, cached).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from agentrl.errors import EnvError
from envs.repo.generate import generate
from envs.repo.generate_config import GenerateConfig
from envs.repo.mutate import candidates
from envs.repo.oracle import run_oracle

PACKAGE = "inflection==0.5.1"


@pytest.fixture(scope="session")
def inflection_src(tmp_path_factory, docker_ready):
    work = tmp_path_factory.mktemp("inflection")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", PACKAGE,
                    "-d", str(work)], check=True, capture_output=True, timeout=300)
    with tarfile.open(next(work.glob("inflection-*.tar.gz"))) as tar:
        tar.extractall(work, filter="data")
    return work / "inflection-0.5.1"


def config(src: Path, out: Path, **kwargs) -> GenerateConfig:
    return GenerateConfig(repo=str(src), out=str(out), name="inflection", seed=0, max_candidates=2, **kwargs)


@pytest.fixture(scope="session")
def generated(inflection_src, tmp_path_factory):
    out = tmp_path_factory.mktemp("generated")
    summary = asyncio.run(generate(config(inflection_src, out)))
    rows = [json.loads(line) for line in (out / "instances.jsonl").read_text().splitlines()]
    return summary, rows, out


def test_generated_instances_fail_some_tests_and_their_history_has_no_fix(generated, inflection_src):
    summary, rows, out = generated
    assert summary["candidates"] == 2 and summary["validated"] == summary["kept"] == len(rows) >= 1
    fixed = (inflection_src / "inflection" / "__init__.py").read_text()
    for row in rows:
        f2p, p2p = json.loads(row["FAIL_TO_PASS"]), json.loads(row["PASS_TO_PASS"])
        assert f2p and len(p2p) > 100 and not set(f2p) & set(p2p)
        assert f2p[0] in row["problem_statement"] and row["test_patch"] == "" and row["log_parser"] == "parse_log_pytest"
        history = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "sh", row["image"], "-c",
                                  "git log --format=%H; cat inflection/__init__.py"], capture_output=True, text=True,
                                 timeout=120, check=True).stdout
        assert history.startswith(row["base_commit"] + "\n") and history.count("\n") > 2  # one commit: the buggy base
        assert fixed not in history  # the fix is nowhere in the image's repository
        assert (out / "harbor" / row["instance_id"] / "solution" / "solve.sh").is_file()
    assert (out / "train.jsonl").read_text().count("\n") == len(rows)  # one module: nothing to hold out


def test_the_oracle_resolves_every_instance_in_both_formats(generated):
    _, rows, out = generated
    harbor = out / "harbor" / rows[0]["instance_id"]
    swebench, harbor_report = asyncio.run(_both(out / "instances.jsonl", harbor))
    assert (swebench["resolve_rate"], swebench["instances"], swebench["unresolved"]) == (1.0, len(rows), [])
    assert (harbor_report["resolve_rate"], harbor_report["instances"]) == (1.0, 1)


def test_the_oracle_reports_why_a_task_is_not_resolved_and_goes_on(generated, tmp_path):
    _, rows, _ = generated
    broken = [{**rows[0], "instance_id": "no_fix", "patch": ""},  # nothing applied: the failing tests still fail
              {**rows[0], "instance_id": "no_image", "image": "agentrl-test-no-such-image:0"}]
    (tmp_path / "broken.jsonl").write_text("".join(json.dumps(r) + "\n" for r in broken))
    report = asyncio.run(run_oracle(str(tmp_path / "broken.jsonl")))
    assert (report["resolved"], sorted(report["unresolved"])) == (0, ["no_fix", "no_image"])
    assert report["unresolved_why"]["no_fix"]["f2p_fixed"] == 0.0  # the share of FAIL_TO_PASS fixed
    assert "no_image" in report["unresolved_why"] and "error" in report["unresolved_why"]["no_image"]


async def _both(instances: Path, harbor: Path):
    return await asyncio.gather(run_oracle(str(instances), concurrency=2), run_oracle(str(harbor)))


def test_the_same_seed_makes_the_same_instances(generated, inflection_src, tmp_path):
    _, rows, _ = generated
    again = asyncio.run(generate(config(inflection_src, tmp_path)))
    rows_again = [json.loads(line) for line in (tmp_path / "instances.jsonl").read_text().splitlines()]
    assert again["kept"] == len(rows) and rows_again == rows  # ids, images, base commits, patches, tests
    first, other = candidates(inflection_src, 0, limit=4), candidates(inflection_src, 1, limit=4)
    assert [c.buggy for c in first] != [c.buggy for c in other]  # the seed chooses the order and rewrites


def test_a_folder_without_tests_is_refused_in_one_line(tmp_path):
    (tmp_path / "lib.py").write_text("def f():\n    return 1\n")
    with pytest.raises(EnvError, match="no test files"):
        asyncio.run(generate(GenerateConfig(repo=str(tmp_path), out=str(tmp_path / "out"))))

"""Task generation: SWE-bench instances and Harbor task directories from a local Python repository.

    agentrl tasks generate PATH --out DIR [--seed 0] [--max-candidates 200] [--include PREFIX ...]

What it is: SWE-smith's recipe, offline. The repository's image is built (``task_image``), its
test files are run once at the base to learn which tests pass, and each candidate bug
(``mutate``: swesmith's procedural rewrites, one small change each) is written into a worker
container and the tests run again: a candidate is kept when at least one passing test fails
(``FAIL_TO_PASS``) and the others still pass (``PASS_TO_PASS``). A kept bug becomes an image of
its own with a fresh one-commit history at the buggy base (nothing of the fix in it), the gold
``patch`` is the bug's reverse, ``test_patch`` is empty (the tests are already in the
repository, as in SWE-smith's rows), the ``eval_script`` restores the test files from
``base_commit`` and runs them with ``pytest -rA`` (``log_parser``: swebench's
``parse_log_pytest``), and the problem statement is written from the failing tests (names,
assertion messages). Every instance is then validated by the env's own grading
(``envs/repo/grading.grade_swebench``): the gold patch resolves it, the empty patch does not;
one that fails is dropped and counted.

Output in ``--out``: ``instances.jsonl`` (all), ``train.jsonl`` and ``heldout.jsonl`` (split by
the module the bug is in: a share of the modules, chosen by the seed, is held out), ``harbor/``
(one Harbor task directory per instance) and ``summary.json`` (candidates tried, kept,
validated, minutes). Deterministic by seed, given deterministic tests.

What it is not: an LLM rewriter or issue writer (SWE-smith's other generators need a model).
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import hashlib
import json
import math
import random
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentrl.errors import EnvError, SandboxError
from envs.repo import harbor_out
from envs.repo.generate_config import GenerateConfig
from envs.repo.grading import grade_swebench
from envs.repo.mutate import Candidate, candidates, is_test_file
from envs.repo.task_image import instance_image, repo_image
from envs.repo.tasks import read_task
from sandboxes.repo_container import ContainerSpec
from sandboxes.repo_pool import RepoPool, RepoPoolConfig, RepoSession


def test_files(repo: Path) -> list[str]:
    """The repository's test files (relative); an error when ``repo`` is no folder or has none."""
    if not repo.is_dir():
        raise EnvError(f"{repo} is not a folder: pass a local Python repository (a checkout or an unpacked sdist)")
    files = [str(p.relative_to(repo)) for p in sorted(repo.rglob("*.py"))
             if is_test_file(p.relative_to(repo)) and p.name != "conftest.py" and ".git" not in p.parts]
    if not files:
        raise EnvError(f"{repo}: no test files (test_*.py or *_test.py); generation needs the repository's pytest suite")
    return files


def pytest_cmd(tests: list[str]) -> str:
    return "COLUMNS=200 python3 -m pytest -rA -p no:cacheprovider " + " ".join(tests)  # wide: whole messages


def eval_script(base_commit: str, tests: list[str]) -> str:
    """swebench 5.x's eval script: the tests as at ``base_commit``, run between its markers."""
    files = " ".join(tests)
    return "\n".join([
        "#!/bin/bash", "set -uxo pipefail", "cd /testbed", "git config --global --add safe.directory /testbed",
        "git status", f"git -c core.fileMode=false diff {base_commit}", f"git checkout {base_commit} -- {files}",
        ": '>>>>> Start Test Output'", pytest_cmd(tests), ": '>>>>> End Test Output'",
        f"git checkout {base_commit} -- {files}", ""])


def reverse_patch(path: str, buggy: str, fixed: str) -> str:
    """The gold patch: ``buggy`` back to ``fixed``, as ``git apply`` takes it."""
    body = difflib.unified_diff(buggy.splitlines(keepends=True), fixed.splitlines(keepends=True),
                                f"a/{path}", f"b/{path}", n=3)
    lines = [line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in body]
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


def problem_statement(name: str, f2p: list[str], log: str) -> str:
    """Written from the failing tests: their names and the messages of their failures."""
    reasons = {}
    for line in log.splitlines():
        m = re.match(r"(?:FAILED|ERROR) (\S+)(?: - (.*))?$", line)
        if m and m.group(1) in f2p:
            reasons.setdefault(m.group(1), (m.group(2) or "").strip()[:300])
    shown = f2p[:5]
    lines = [f"Tests of {name} fail", "", f"After the last change, {len(f2p)} test(s) of the suite fail "
             "that passed before:", ""]
    lines += [f"- `{t}`" + (f": {reasons[t]}" if reasons.get(t) else "") for t in shown]
    if len(f2p) > len(shown):
        lines.append(f"- and {len(f2p) - len(shown)} more")
    lines += ["", "Find the bug in the library's code and fix it, so that these tests pass again and every other "
              "test still passes. Do not change the tests."]
    return "\n".join(lines) + "\n"


def statuses(log: str) -> dict[str, str]:
    from swebench.harness.log_parsers.python import parse_log_pytest

    return parse_log_pytest(log, None)


@dataclass
class Outcome:
    candidate: Candidate
    f2p: list[str]
    p2p: list[str]
    log: str


async def run_tests(session: RepoSession, tests: list[str], timeout_s: float) -> str:
    out = await session.exec(["/bin/bash", "-c", pytest_cmd(tests)], timeout_s=timeout_s)
    return out.output.decode(errors="replace") + ("\nTimeout" if out.timed_out else "")


async def try_candidates(pool: RepoPool, spec: ContainerSpec, cfg: GenerateConfig, tests: list[str],
                         passed: set[str], todo: list[Candidate]) -> tuple[list[Outcome], int]:
    """Every candidate run in one of ``concurrency`` worker containers: the kept ones, in ``todo``'s
    order, and the number lost to container failures (a candidate whose container failed is tried
    once more, in a new one; three failures in a row end the generation)."""
    queue = list(enumerate(todo))
    kept: dict[int, Outcome] = {}
    counts = {"done": 0, "lost": 0, "failures": 0}

    async def judge(session: RepoSession, i: int, cand: Candidate) -> None:
        await session.write_file(f"/testbed/{cand.path}", cand.buggy.encode())
        try:
            log = await run_tests(session, tests, cfg.test_timeout_s)
        finally:
            await session.write_file(f"/testbed/{cand.path}", cand.fixed.encode())
        now = {t for t, s in statuses(log).items() if s == "PASSED"}
        f2p, p2p = sorted(passed - now), sorted(passed & now)
        if f2p and p2p and len(f2p) <= cfg.max_fail_to_pass:
            kept[i] = Outcome(cand, f2p, p2p, log)
        counts["done"] += 1
        counts["failures"] = 0
        if counts["done"] % 10 == 0 or counts["done"] == len(todo):
            print(f"{cfg.name}: {counts['done']}/{len(todo)} candidates tried, {len(kept)} kept", file=sys.stderr,
                  flush=True)

    async def worker() -> None:
        item, retried = None, False
        while queue or item:
            try:
                async with pool.episode(spec) as session:
                    while queue or item:
                        item = item or queue.pop(0)
                        await judge(session, *item)
                        item, retried = None, False
            except SandboxError as e:
                counts["failures"] += 1
                if counts["failures"] >= 3:
                    raise
                print(f"{cfg.name}: a worker container failed ({e}); a new one goes on", file=sys.stderr, flush=True)
                if item is not None and retried:
                    item, retried, counts["lost"] = None, False, counts["lost"] + 1
                else:
                    retried = item is not None

    await asyncio.gather(*[worker() for _ in range(min(cfg.concurrency, len(todo)) or 1)])
    return [kept[i] for i in sorted(kept)], counts["lost"]


def make_row(cfg: GenerateConfig, tests: list[str], image: str, base: str, kept: Outcome) -> dict[str, Any]:
    cand = kept.candidate
    key = hashlib.sha256((cand.path + cand.buggy).encode()).hexdigest()[:8]
    return {"instance_id": f"{cfg.name}__{cand.strategy}__{key}", "repo": cfg.name, "version": "", "base_commit": base,
            "problem_statement": problem_statement(cfg.name, kept.f2p, kept.log), "hints_text": "",
            "patch": reverse_patch(cand.path, cand.buggy, cand.fixed), "test_patch": "",
            "FAIL_TO_PASS": json.dumps(kept.f2p), "PASS_TO_PASS": json.dumps(kept.p2p), "image": image,
            "eval_script": eval_script(base, tests), "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail",
            "module": cand.module, "file": cand.path, "strategy": cand.strategy}


async def validate(pool: RepoPool, row: dict[str, Any], timeout_s: float) -> bool:
    """The env's grading agrees: the gold patch resolves the instance, the empty patch does not."""
    task = read_task(row, ContainerSpec(image=row["image"]))
    for attempt in range(2):  # a container that fails to start is no verdict: once more
        try:
            gold, empty = await asyncio.gather(grade_swebench(pool, task, row["patch"], timeout_s),
                                               grade_swebench(pool, task, "", timeout_s))
            return bool(gold["resolved"]) and not empty["resolved"]
        except SandboxError as e:
            print(f"{row['instance_id']}: grading failed ({e})" + ("; once more" if not attempt else ""),
                  file=sys.stderr, flush=True)
    return False


def split(rows: list[dict[str, Any]], seed: int, share: float) -> set[str]:
    """The held-out modules: ``share`` of them (rounded up; none when there is one), chosen by ``seed``."""
    modules = sorted({r["module"] for r in rows})
    if len(modules) < 2:
        return set()
    random.Random(seed).shuffle(modules)
    return set(modules[: min(len(modules) - 1, math.ceil(share * len(modules)))])


async def generate(cfg: GenerateConfig) -> dict[str, Any]:
    """Run the recipe of the module docstring; the summary (also ``summary.json``)."""
    repo, out, t0 = Path(cfg.repo), Path(cfg.out), time.monotonic()
    pool = RepoPool(RepoPoolConfig(warm=0))
    try:
        tests = await pool.in_thread(test_files, repo)
        image = await pool.in_thread(repo_image, repo, cfg.name, cfg.pip_specs)
        spec = ContainerSpec(image=image, workdir="/testbed", memory_mb=2048)
        async with pool.episode(spec) as session:
            log = await run_tests(session, tests, cfg.test_timeout_s)
        passed = {t for t, s in statuses(log).items() if s == "PASSED"}
        if not passed:
            raise EnvError(f"{repo}: no test passes at the base; the suite's output ends with: {log[-800:]}")
        todo = await pool.in_thread(candidates, repo, cfg.seed, cfg.prefixes, cfg.max_candidates)
        kept, lost = await try_candidates(pool, spec, cfg, tests, passed, todo)
        rows = []
        for outcome in kept:
            tag, base = await pool.in_thread(instance_image, image, cfg.name, outcome.candidate.path, outcome.candidate.buggy)
            rows.append(make_row(cfg, tests, tag, base, outcome))
        ok = await _validate_all(pool, rows, cfg)
    finally:
        await pool.aclose()
    valid = [r for r, good in zip(rows, ok, strict=True) if good]
    held = split(valid, cfg.seed, cfg.heldout_share)
    for row in valid:
        row["split"] = "heldout" if row["module"] in held else "train"
    summary = {"repo": cfg.name, "seed": cfg.seed, "tests_passing": len(passed), "candidates": len(todo),
               "lost_to_container_failures": lost, "kept": len(rows), "validated": len(valid), "train": sum(r["split"] == "train" for r in valid),
               "heldout": len(valid) - sum(r["split"] == "train" for r in valid), "heldout_modules": sorted(held),
               "minutes": round((time.monotonic() - t0) / 60, 2)}
    await asyncio.to_thread(_write, out, cfg, valid, summary)
    return summary


async def _validate_all(pool: RepoPool, rows: list[dict[str, Any]], cfg: GenerateConfig) -> list[bool]:
    gate = asyncio.Semaphore(cfg.concurrency)

    async def one(row: dict[str, Any]) -> bool:
        async with gate:
            return await validate(pool, row, cfg.test_timeout_s)

    return list(await asyncio.gather(*[one(r) for r in rows]))


def _write(out: Path, cfg: GenerateConfig, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, chosen in (("instances", rows), ("train", [r for r in rows if r["split"] == "train"]),
                         ("heldout", [r for r in rows if r["split"] == "heldout"])):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chosen))
    if cfg.harbor:
        for row in rows:
            harbor_out.write_task(out / "harbor" / row["instance_id"], row)
    (out / "summary.json").write_text(json.dumps({**summary, "config": asdict(cfg)}, indent=1) + "\n")


def main(cfg: GenerateConfig) -> dict[str, Any]:
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(generate(cfg))
    raise EnvError("interrupted: nothing was written")

"""Grading repository tasks by their own tests, out of the agent's reach.

What it is:

  * ``place_files``: a row's ``files`` written into the container's workdir and committed
    (``tasks.FILES_COMMIT``), checked to give the row's ``base_commit``; for the episode's
    container and the grading's fresh one alike.
  * ``agent_diff``: the agent's change as SWE-bench takes it — everything in the working tree
    (new files included) against ``base_commit``, the files of ``test_patch`` left out.
  * ``grade_swebench``: that diff applied in a *fresh* container of the task's image with
    swebench's own patch commands (``GIT_APPLY_CMDS``: ``git apply``, ``--3way``, ``--reject``,
    ``patch --fuzz``), then the instance's ``eval_script`` (which reapplies ``test_patch``), its
    log read by swebench's ``get_eval_report`` (the instance's ``log_parser`` from
    ``PARSER_REGISTRY``, FAIL_TO_PASS / PASS_TO_PASS, resolved or not). Nothing of swebench's
    grading is re-implemented here. An empty diff is not applied; the tests still run (its
    PASS_TO_PASS share is reported).
  * ``grade_harbor``: the task's verifier as Harbor runs it, in the episode's container after
    the agent: every process the agent left is killed, ``tests/`` is copied to ``/tests`` (it
    was never in the container before), ``/logs/verifier`` emptied, ``bash /tests/test.sh`` run
    with the verifier's env and timeout; the reward is ``reward.txt`` (a number) or
    ``reward.json`` (its ``reward`` key, or its only value; every number is reported).

What is not covered: a Harbor verifier runs in the agent's own container (as in Harbor), so an
agent that replaces the tools ``test.sh`` uses can fool it; SWE-bench grading has no such gap.
"""

from __future__ import annotations

import json
import tempfile
import time
from typing import Any

from agentrl.errors import EnvError
from envs.repo.tasks import FILES_COMMIT, RepoTask
from sandboxes.repo_pool import RepoPool, RepoSession


def _swebench() -> Any:
    try:
        from swebench.harness import grading, utils
        from swebench.harness.run_evaluation import GIT_APPLY_CMDS
    except ImportError as e:
        raise EnvError("grading SWE-bench instances needs swebench 5.x (pip install 'agentrl[repo]')") from e
    return grading, utils, GIT_APPLY_CMDS


async def place_files(session: RepoSession, task: RepoTask) -> None:
    """Write ``task.files`` into the session's workdir as one commit (nothing when there are none)."""
    files = task.files
    if not files:
        return
    await session.put_tree(session.workdir, {path: text.encode() for path, text in files.items()})
    done = await session.exec(["sh", "-c", f'cd "$0" && {FILES_COMMIT}', session.workdir, *sorted(files)],
                              timeout_s=120)
    commit = done.output.decode(errors="replace").strip()
    if done.exit_code != 0 or commit != task.row.get("base_commit"):
        raise EnvError(f"{task.task_id}: its files committed in the container gave {commit[-300:]!r} (exit "
                       f"{done.exit_code}), not the row's base_commit {task.row.get('base_commit')!r}; make "
                       "base_commit with envs.repo.tiny_repos.files_commit")


async def agent_diff(session: RepoSession, task: RepoTask) -> str:
    """The agent's change against ``base_commit`` (SWE-bench) or ``HEAD``, test files left out."""
    base = task.row.get("base_commit", "HEAD")
    excludes = [f":(exclude){path}" for path in task.test_files]
    cmd = ["git", "-c", "core.fileMode=false", "diff", "--cached", "--no-color", "--binary", base, "--", ".", *excludes]
    added = await session.exec(["git", "add", "-A"], timeout_s=120)
    if added.exit_code != 0:
        return ""
    out = await session.exec(cmd, timeout_s=120)
    return out.output.decode(errors="replace") if out.exit_code == 0 else ""


async def grade_swebench(pool: RepoPool, task: RepoTask, diff: str, timeout_s: float) -> dict[str, Any]:
    """Facts of ``diff`` on the instance: ``resolved``, ``f2p_fixed``, ``p2p_kept``,
    ``patch_applied``, ``grade_s``; see the module docstring."""
    grading, utils, apply_cmds = _swebench()
    test_spec = utils.make_test_spec(task.row)
    t0 = time.monotonic()
    facts: dict[str, Any] = {"resolved": False, "f2p_fixed": 0.0, "p2p_kept": 0.0, "patch_applied": False}
    async with pool.episode(task.spec) as fresh:
        await place_files(fresh, task)
        if diff.strip():
            await fresh.write_file("/tmp/patch.diff", diff.encode())
            for i, apply in enumerate(apply_cmds):
                if i:  # a failed try can leave a partial state behind
                    await fresh.exec(["/bin/bash", "-c", "git checkout -- . ; git clean -fdq"], timeout_s=120)
                if (await fresh.exec(["/bin/bash", "-c", f"{apply} /tmp/patch.diff"], timeout_s=120)).exit_code == 0:
                    facts["patch_applied"] = True
                    break
            else:
                return {**facts, "grade_s": time.monotonic() - t0, "grade_log": "the patch did not apply"}
        await fresh.write_file("/eval.sh", test_spec.eval_script.encode())
        run = await fresh.exec(["/bin/bash", "/eval.sh"], timeout_s=timeout_s)
    log = run.output.decode(errors="replace") + (f"\n\nTimeout error: {timeout_s} seconds exceeded." if run.timed_out else "")
    with tempfile.NamedTemporaryFile("w", suffix=".log", encoding="utf-8") as f:
        f.write(log)
        f.flush()
        prediction = {"instance_id": task.task_id, "model_name_or_path": "agentrl", "model_patch": diff}
        report = grading.get_eval_report(test_spec, prediction, f.name, include_tests_status=True)[task.task_id]
    status = report.get("tests_status")
    facts.update(resolved=bool(report["resolved"]) and not run.timed_out, grade_s=time.monotonic() - t0,
                 tests_ran=bool(status), grade_log=log[-2000:])
    if status:
        facts.update(f2p_fixed=grading.compute_fail_to_pass(status), p2p_kept=grading.compute_pass_to_pass(status))
    return facts


def _reward_of(text: str, name: str) -> tuple[float, dict[str, float]]:
    if name == "reward.txt":
        return float(text.strip()), {}
    data = json.loads(text)
    if not isinstance(data, dict) or not data:
        raise ValueError("reward.json must be an object of numbers")
    numbers = {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))}
    if "reward" in numbers:
        return numbers["reward"], numbers
    if len(numbers) == 1:
        return next(iter(numbers.values())), numbers
    raise ValueError(f"reward.json has several numbers and no 'reward' key: {sorted(numbers)}")


async def grade_harbor(session: RepoSession, task: RepoTask) -> dict[str, Any]:
    """Facts of the episode's end state under the task's verifier: ``reward``, ``resolved``
    (reward >= 1), ``verifier_exit``, the numbers of ``reward.json``; see the module docstring."""
    assert task.task_dir is not None
    t0 = time.monotonic()
    await session.kill_processes()
    tests = {str(p.relative_to(task.task_dir / "tests")): p.read_bytes()
             for p in sorted((task.task_dir / "tests").rglob("*")) if p.is_file()}
    await session.exec(["sh", "-c", "rm -rf /tests /logs/verifier; mkdir -p /logs/verifier /logs/agent"], timeout_s=120)
    await session.put_tree("/tests", tests)
    run = await session.exec(["bash", "/tests/test.sh"], timeout_s=task.verifier_timeout_s, env=task.verifier_env)
    facts: dict[str, Any] = {"reward": 0.0, "resolved": False, "verifier_exit": run.exit_code,
                             "verifier_timed_out": run.timed_out, "grade_log": run.output[-2000:].decode(errors="replace")}
    for name in ("reward.txt", "reward.json"):
        try:
            text = (await session.read_file(f"/logs/verifier/{name}")).decode()
        except FileNotFoundError:
            continue
        try:
            reward, numbers = _reward_of(text, name)
        except ValueError as e:
            facts["grade_error"] = f"/logs/verifier/{name}: {e}"
            break
        facts.update({f"verifier/{k}": v for k, v in numbers.items()})
        facts.update(reward=reward, resolved=reward >= 1.0)
        break
    else:
        facts["grade_error"] = "the verifier wrote no /logs/verifier/reward.txt or reward.json"
    facts["grade_s"] = time.monotonic() - t0
    return facts

"""The oracle agent: a scripted player of ``agentrl/Repo-v0`` that applies each task's gold patch.

What it is: the check that generation and grading agree. For every row of a task set it plays
one episode of the env with two replies in the env's own tool-call format: a ``bash`` call
that applies the row's ``patch`` with ``git apply`` (a Harbor task: runs its ``solution/solve.sh``), then ``submit``; the env grades the
repository as it then is (SWE-bench rows: swebench's grading in a fresh container). A sound
task set is resolved 100%.

    agentrl tasks oracle DATASET [--concurrency 2]

What it is not: a model, or a way to train one (the episodes are not rollouts).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import gymnasium

import envs  # noqa: F401  (registers agentrl/Repo-v0)
from envs.repo.tasks import load_tasks


def tool_call(name: str, **arguments: Any) -> str:
    """One call in the default (hermes) tool-call format the env reads."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def replies(row: dict[str, Any]) -> list[str]:
    """SWE-bench rows: ``git apply`` of the gold patch; Harbor tasks: their ``solution/solve.sh``."""
    if "task_dir" in row:
        solve = (Path(row["task_dir"]) / "solution" / "solve.sh").read_text()
        return [tool_call("bash", command=f"bash <<'EOF_GOLD_SOLVE'\n{solve}EOF_GOLD_SOLVE"), tool_call("submit")]
    return [tool_call("bash", command=f"git apply - <<'EOF_GOLD_PATCH'\n{row['patch']}EOF_GOLD_PATCH"), tool_call("submit")]


async def play(row: dict[str, Any], **env_kwargs: Any) -> dict[str, Any]:
    """One episode: the instance's id, its reward and whether it was resolved."""
    env = gymnasium.make("agentrl/Repo-v0", **{"max_turns": 4, **env_kwargs}).unwrapped
    reward, info, why = 0.0, {}, {}
    try:
        await env.areset(options={"task": row})
        for reply in replies(row):
            _, reward, terminated, truncated, info = await env.astep(reply)
            if terminated or truncated:
                break
        why = {k: info[k] for k in ("patch_applied", "f2p_fixed", "p2p_kept", "verifier_exit") if k in info}
        if env.last_grade.get("grade_log"):
            why["grade_log_tail"] = str(env.last_grade["grade_log"])[-400:]
    finally:
        await env.aclose()
    return {"instance_id": row.get("instance_id") or Path(row["task_dir"]).name, "reward": float(reward),
            "resolved": bool(info.get("resolved")), "why": why}


async def run_oracle(dataset: str, concurrency: int = 2, limit: int = 0, **env_kwargs: Any) -> dict[str, Any]:
    """Every row of ``dataset`` (or the first ``limit``) played; the report: resolved share, the
    ids not resolved and why (the grading's facts and log tail, or the error that stopped one)."""
    rows = load_tasks(dataset)[: limit or None]
    gate, t0 = asyncio.Semaphore(concurrency), time.monotonic()

    async def one(row: dict[str, Any]) -> dict[str, Any]:
        async with gate:
            try:
                return await play(row, **env_kwargs)
            except Exception as e:  # a task that cannot even start is a finding of the report, not its end
                return {"instance_id": row.get("instance_id") or Path(row.get("task_dir", "?")).name, "reward": 0.0,
                        "resolved": False, "why": {"error": f"{type(e).__name__}: {e}"[:400]}}

    results = await asyncio.gather(*[one(r) for r in rows])
    resolved = sum(r["resolved"] for r in results)
    return {"instances": len(rows), "resolved": resolved, "resolve_rate": resolved / len(rows) if rows else 0.0,
            "unresolved": [r["instance_id"] for r in results if not r["resolved"]],
            "unresolved_why": {r["instance_id"]: r["why"] for r in results if not r["resolved"]},
            "minutes": round((time.monotonic() - t0) / 60, 2)}

"""Evaluation without training: pass@1 and pass@k with confidence intervals, resumable.

What it is: ``evaluate(workflow, engine, rows, k=...)`` plays ``k`` episodes of every row
(concurrently, bounded), scores each by its success (``metrics["success"]`` when the env
reports one, else ``reward > 0``) and returns an ``EvalReport``: per-problem success counts,
the mean of each named reward term (``reward/NAME``) over all episodes and over the successful
ones (``episodes/reward/NAME``, ``successes/reward/NAME``),
pass@k' for every k' ≤ k with the unbiased estimator of Chen et al. 2021 (``1 − C(n−c, k')/C(n, k')``
averaged over problems) and a normal-approximation 95% interval over problems. With ``out``
(a JSONL path), each finished problem is appended as it completes and a rerun skips the
problems already there: an interrupted evaluation resumes. ``curate`` writes the rows the
model does not always solve (AReaL v0.2's lesson: drop what is already learned).

What it is not: greedy decoding by itself (the workflow's sampling decides) or a trainer.
Main hook: ``report = await evaluate(workflow, engine, rows, k=4, out=path)``.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.api import InferenceClient, Trajectory, TrajectoryStatus, Workflow
from agentrl.rollout.episode import guarded

# The files `agentrl eval --out DIR` leaves in DIR.
RESULTS = "eval.jsonl"
"""``DIR/eval.jsonl``: the results per problem, written as they finish (what a rerun resumes)."""

SUMMARY = "eval_summary.json"
"""``DIR/eval_summary.json``: the report of a finished evaluation (the last line printed); absent
while one runs (``agentrl view`` tells a finished evaluation by it)."""

SETTINGS = "eval_settings.json"
"""``DIR/eval_settings.json``: what the results in ``DIR/eval.jsonl`` were measured with."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(at least one of k samples succeeds) from c successes in n samples."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def episode_success(trajectories: Sequence[Trajectory] | None) -> bool:
    """An episode succeeded when it finished OK and its env said so (or its reward is > 0)."""
    if not trajectories or any(t.status is not TrajectoryStatus.OK for t in trajectories):
        return False
    last = trajectories[-1]
    if "success" in last.metrics:
        return bool(last.metrics["success"])
    return last.reward > 0


@dataclass
class EvalReport:
    """Per-problem results and the pass@k' table. Every figure is aggregated in row order, not
    in the order problems finished, so two deterministic runs give equal floats to the last digit."""

    k: int
    successes: dict[int, int] = field(default_factory=dict)  # row index -> successes out of k
    failed_episodes: int = 0
    errors: dict[int, str] = field(default_factory=dict)  # row index -> "status: error" of its first failed episode
    episode_terms: dict[int, list[tuple[str, float, bool]]] = field(default_factory=dict)  # row -> (reward/NAME,
    # value, success) of each episode

    def add_terms(self, index: int, trajectories: Sequence[Trajectory] | None, success: bool) -> None:
        """Keep an episode's named reward terms (``reward/NAME`` of its last trajectory's
        metrics, e.g. ToolUse's ``used_tool_result``) under its row ``index``."""
        if not trajectories:
            return
        self.episode_terms.setdefault(index, []).extend(
            (key, float(value), success) for key, value in trajectories[-1].metrics.items() if key.startswith("reward/"))

    @property
    def first_error(self) -> str | None:
        """The error of the lowest row with a failed episode."""
        return self.errors[min(self.errors)] if self.errors else None

    @property
    def problems(self) -> int:
        return len(self.successes)

    def pass_at(self, k: int) -> tuple[float, float]:
        """(mean pass@k over problems, half-width of its 95% interval)."""
        values = [pass_at_k(self.k, self.successes[i], k) for i in sorted(self.successes)]
        if not values:
            return 0.0, 0.0
        mean = sum(values) / len(values)
        var = sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1)
        return mean, 1.96 * math.sqrt(var / len(values))

    def summary(self) -> dict[str, float]:
        out: dict[str, float] = {"problems": float(self.problems), "failed_episodes": float(self.failed_episodes)}
        for k in sorted({1, self.k} | {2 ** i for i in range(1, 10) if 2 ** i < self.k}):
            mean, ci = self.pass_at(k)
            out[f"pass@{k}"], out[f"pass@{k}_ci95"] = mean, ci
        tables: dict[str, dict[str, list[float]]] = {"episodes": {}, "successes": {}}
        for index in sorted(self.episode_terms):
            for key, value, success in self.episode_terms[index]:
                for prefix in ("episodes", "successes") if success else ("episodes",):
                    total = tables[prefix].setdefault(key, [0.0, 0.0])
                    total[0] += value
                    total[1] += 1
        for prefix, table in tables.items():
            for key, (total, n) in sorted(table.items()):
                out[f"{prefix}/{key}"] = total / n  # e.g. successes/reward/used_tool_result
        return out


async def evaluate(workflow: Workflow, engine: InferenceClient, rows: Sequence[Mapping[str, Any]], *, k: int = 1,
                   concurrency: int = 256, out: str | Path | None = None,
                   on_problem: Any = None, samples: int = 0, decode: Any = None) -> EvalReport:
    """Play ``k`` episodes of each row; see the module docstring. ``on_problem(index, c)`` is
    called as each problem finishes (progress). With ``out``, each problem's line has
    ``index``, ``k``, ``successes``, ``failed``, ``row`` and, when an episode failed, ``error``
    (the first failed one's ``"status: error"``); the trajectories of the first
    ``samples`` episodes of each problem go into its line (``samples``: ``Trajectory.to_dict()``
    plus ``sample``, the episode's number, and ``tokens``, each token's text by ``decode(ids)``
    when given), for ``agentrl view``."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    report = EvalReport(k)
    path = Path(out) if out is not None else None
    if path is not None and path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("k") == k:
                report.successes[int(rec["index"])] = int(rec["successes"])
                report.failed_episodes += int(rec.get("failed", 0))
                if rec.get("error"):
                    report.errors[int(rec["index"])] = rec["error"]
    sem = asyncio.Semaphore(max(1, concurrency))
    sink = path.open("a", buffering=1) if path is not None else None

    async def episode(row: Mapping[str, Any]) -> list[Trajectory] | None:
        async with sem:  # a failing episode is a failure, not the end of the evaluation
            return await guarded(workflow.arun_episode(engine, dict(row)), timeout_s=None, what="eval episode")

    async def problem(index: int, row: Mapping[str, Any]) -> None:
        results = await asyncio.gather(*(episode(row) for _ in range(k)))
        c = sum(episode_success(r) for r in results)
        for r in results:
            report.add_terms(index, r, episode_success(r))
        failures = [t for r in results for t in r or [] if t.status is not TrajectoryStatus.OK]
        failed = sum(1 for r in results if r and any(t.status is not TrajectoryStatus.OK for t in r))
        error = f"{failures[0].status.value}: {(failures[0].error or '')[:500]}" if failures else None
        report.successes[index] = c
        report.failed_episodes += failed
        if error is not None:
            report.errors[index] = error
        if sink is not None:
            record = {"index": index, "k": k, "successes": c, "failed": failed, "row": dict(row)}
            if error is not None:
                record["error"] = error
            if samples:
                record["samples"] = [sample_row(t, j, decode) for j, r in enumerate(results[:samples]) for t in r or []]
            sink.write(json.dumps(record) + "\n")
        if on_problem is not None:
            on_problem(index, c)

    try:
        await asyncio.gather(*(problem(i, row) for i, row in enumerate(rows) if i not in report.successes))
    finally:
        if sink is not None:
            sink.close()
    return report


def sample_row(t: Trajectory, sample: int, decode: Any = None) -> dict[str, Any]:
    """One evaluation sample's trajectory as a JSON object (see ``evaluate``'s ``samples``)."""
    row = t.to_dict() | {"sample": sample}
    if decode is not None:
        row["tokens"] = [decode([tok]) for tok in t.input_ids]
    return row


def curate(rows: Sequence[Mapping[str, Any]], report: EvalReport, out: str | Path) -> int:
    """Write the rows not solved in all ``k`` samples to ``out`` (JSONL); returns how many."""
    kept = [dict(row) for i, row in enumerate(rows) if report.successes.get(i, 0) < report.k]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text("".join(json.dumps(r) + "\n" for r in kept))
    return len(kept)

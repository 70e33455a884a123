"""The viewer as one file: ``agentrl view RUN_DIR --export report.html``.

What it is: ``export_report(runs, out, max_bytes=...)`` — the page with everything it shows
embedded (metrics, every sampled step's trajectories, the evaluation with its samples), so
it opens from ``file://`` with no server and no network. The file is bounded: when the
data would pass ``max_bytes``: metric rows past a quarter of it are thinned evenly (evaluation
rows always kept); the longest trajectories are cut — each keeps its first and last tokens,
marked ``truncated: {head, total, ...}``, and the page says so where it shows them — down to
``MIN_TOKENS`` tokens; past that, sampled steps are dropped evenly (the last always kept).
Per-token floats are rounded (``ROUNDED``). Every cut is one line in the page's notes banner. What it is not: live (an export is a snapshot) or the reader of
the files (``agentrl.view.rundata``). Main hook: ``export_report([RunData(path)], out)``.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.view.page import render_page
from agentrl.view.rundata import RunData

DEFAULT_MAX_BYTES = 20 * 1024 * 1024
MIN_TOKENS = 64  # a trajectory is never cut below this many tokens
TOKEN_FIELDS = ("input_ids", "loss_mask", "logprobs", "versions", "tokens", "trainer_logprobs", "entropy")


ROUNDED = {"logprobs": 4, "trainer_logprobs": 4, "entropy": 3}  # decimals kept in the file


def compact(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with its per-token floats rounded (``ROUNDED``): a smaller file, the same picture."""
    out = dict(row)
    for key, digits in ROUNDED.items():
        if isinstance(row.get(key), list):
            out[key] = [round(x, digits) if isinstance(x, float) else x for x in row[key]]
    return out


def size_of(obj: Any) -> int:
    return len(json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode())


def truncate(row: dict[str, Any], keep: int) -> dict[str, Any]:
    """``row`` with only its first ``keep // 2`` and last ``keep - keep // 2`` tokens (a copy);
    ``truncated`` says how many there were and how many turns began before the kept tail."""
    total = len(row.get("input_ids") or [])
    if total <= keep:
        return row
    head, tail = keep // 2, keep - keep // 2
    out = dict(row)
    for key in TOKEN_FIELDS:
        if isinstance(row.get(key), list) and len(row[key]) == total:
            out[key] = row[key][:head] + row[key][total - tail:]
    mask = row.get("loss_mask") or [0] * total
    starts = [i for i in range(total) if mask[i] and (i == 0 or not mask[i - 1])]  # where each turn begins
    out["truncated"] = {"head": head, "total": total, "turns_before_tail": sum(1 for i in starts if i < total - tail),
                        "tail_continues": bool(mask[total - tail] and mask[total - tail - 1])}
    return out


class _Budget:
    """Fits a set of trajectory rows under a byte budget by a common cap on their tokens."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        # bytes of a row ≈ fixed + per_token * tokens
        self.cost = []
        for r in rows:
            n = len(r.get("input_ids") or [])
            whole = size_of(r)
            fixed = size_of({k: v for k, v in r.items() if k not in TOKEN_FIELDS}) + 16 * len(TOKEN_FIELDS)
            self.cost.append((fixed, (whole - fixed) / max(n, 1), n))

    def bytes_at(self, cap: int | None) -> float:
        return sum(f + p * (n if cap is None else min(n, cap)) for f, p, n in self.cost)

    def cap_for(self, budget: float) -> int | None:
        """The largest token cap that fits (None: no cap needed; MIN_TOKENS when none fits)."""
        if self.bytes_at(None) <= budget:
            return None
        lo, hi = MIN_TOKENS, max((n for _, _, n in self.cost), default=MIN_TOKENS)
        if self.bytes_at(lo) > budget:
            return MIN_TOKENS
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.bytes_at(mid) <= budget else (lo, mid)
        return lo


def thin(items: list[Any], keep: int) -> list[Any]:
    """``keep`` items spread evenly over ``items``, the last always among them."""
    if keep >= len(items):
        return items
    if keep <= 1:
        return items[-1:]
    picks = {round(i * (len(items) - 1) / (keep - 1)) for i in range(keep)}
    return [x for i, x in enumerate(items) if i in picks]


def collect(run: RunData, max_bytes: int, notes: list[str]) -> dict[str, Any]:
    """One run's data, fitted into ``max_bytes``; each cut is appended to ``notes``."""
    metrics = run.metrics()["rows"]
    evaluation = run.evaluation()
    for p in evaluation:
        if p.get("samples"):
            p["samples"] = [compact(x) for x in p["samples"]]
    steps = {step: [compact(t) for t in run.trajectories(step)] for step in run.steps()}
    budget = max_bytes
    m_bytes = size_of(metrics)
    if m_bytes > budget // 4:  # metrics may take a quarter of the budget; evaluation rows always stay
        train = [r for r in metrics if not any(k.startswith("eval/") for k in r)]
        keep = max(2, int(len(train) * (budget // 4) / m_bytes))
        kept = set(map(id, thin(train, keep)))
        before = len(metrics)
        metrics = [r for r in metrics if id(r) in kept or any(k.startswith("eval/") for k in r)]
        notes.append(f"{run.name}: {len(metrics)} of {before} metric rows kept (evenly spaced) to bound the file")
    budget -= size_of(metrics) + size_of({k: v for k, v in run.info().items()})
    samples = [s for p in evaluation for s in p.get("samples") or []]
    rows = [t for ts in steps.values() for t in ts] + samples
    cap = _Budget(rows).cap_for(budget)
    if cap == MIN_TOKENS and _Budget(rows).bytes_at(MIN_TOKENS) > budget:
        # even cut short, the steps do not all fit: keep evenly spaced ones (the last among them)
        order = sorted(steps)
        cost = {s: _Budget(steps[s]).bytes_at(MIN_TOKENS) for s in order}
        room = budget - _Budget(samples).bytes_at(MIN_TOKENS)
        keep = len(order)
        while keep > 1 and sum(cost[s] for s in thin(order, keep)) > room:
            keep = min(keep - 1, keep * 9 // 10)
        kept_steps = thin(order, keep)
        notes.append(f"{run.name}: the trajectories of {len(kept_steps)} of {len(order)} sampled steps kept "
                     f"(evenly spaced, the last included) to bound the file")
        steps = {s: steps[s] for s in kept_steps}
        rows = [t for ts in steps.values() for t in ts] + samples
        cap = _Budget(rows).cap_for(budget)
    if cap is not None:
        cut = sum(1 for t in rows if len(t.get("input_ids") or []) > cap)
        if cut:
            notes.append(f"{run.name}: {cut} of the longest trajectories cut to {cap} tokens (their first and last "
                         f"tokens kept; each says so where it is shown) to bound the file")
        steps = {s: [truncate(t, cap) for t in ts] for s, ts in steps.items()}
        for p in evaluation:
            if p.get("samples"):
                p["samples"] = [truncate(s, cap) for s in p["samples"]]
    info = run.info()
    info["steps"] = sorted(steps)
    return {"info": info, "metrics": metrics, "trajectories": {str(s): ts for s, ts in steps.items()},
            "eval": evaluation}


def export_report(runs: Sequence[RunData], out: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, Any]:
    """Write the self-contained page of ``runs`` (the first looked at, the rest compared) to
    ``out``; returns ``{"path", "bytes", "notes"}``."""
    title = f"agentrl view: {runs[0].name}"
    room = max_bytes - len(render_page({}, title=title).encode())
    for _ in range(6):  # the estimate is close; shrink until the written page fits
        notes: list[str] = []
        share = max(0, room) // max(1, len(runs))
        data = {"runs": [collect(run, share, notes) for run in runs], "notes": notes,
                "exported": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")}
        page = render_page(data, title=title)
        if len(page.encode()) <= max_bytes:
            break
        room = int(room * 0.85)
    else:
        notes.append(f"this file is {len(page.encode()) / 2**20:.2f} MiB, over the bound of {max_bytes / 2**20:.2f} "
                     f"MiB: even its smallest form (one step, {MIN_TOKENS} tokens a trajectory) does not fit")
        page = render_page(data, title=title)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return {"path": str(path), "bytes": len(page.encode()), "notes": notes}

"""What a run leaves to look at: per-step metrics, sampled trajectories, curves and a summary.

What it is: ``RunLog`` — every step's metrics appended to ``RUN_DIR/metrics.jsonl`` (one JSON
object a line, ``step`` first), the same scalars as TensorBoard event files in
``RUN_DIR/tensorboard`` (and Weights & Biases when a project is configured), a bounded sample
of each step's trajectories in ``RUN_DIR/trajectories/step_NNNNNN.jsonl`` (tokens, their text,
loss mask, behaviour and trainer log-probabilities, the trainer's entropies, versions, reward
and its parts, advantage; then the step's failed episodes, with their status and error), every
trajectory of each step whole in ``RUN_DIR/record/step_NNNNNN.jsonl`` (with its episode's
environment record: ``agentrl.rollout.record``), and
``RUN_DIR/curves.png`` redrawn from ``metrics.jsonl`` (``plot_curves``). ``batch_metrics``
turns one step's trajectories into the rollout-side scalars (reward, success, lengths,
staleness histogram). What it is not: the progress line (``agentrl.run.loop``) or the
numbers of the loss (the actor reports those).
"""

from __future__ import annotations

import json
import logging
import math
import os
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.api import Trajectory, TrajectoryStatus
from agentrl.rollout.record import RECORD_DIR, step_file

log = logging.getLogger(__name__)

CURVES = (  # (panel title, metric keys) of curves.png
    ("reward", ("rollout/reward_mean", "rollout/success_rate")),
    ("held-out evaluation", ("eval/pass@1",)),
    ("response tokens", ("rollout/response_tokens_mean",)),
    ("loss", ("train/loss", "train/policy_loss", "eval/heldout_loss")),  # eval/heldout_loss: agentrl sft
    ("clipping and importance weights", ("train/clip_frac", "train/capped_frac", "train/behaviour_weight_mean")),
    ("entropy", ("train/entropy",)),
    ("staleness (versions)", ("batch/staleness_mean", "batch/staleness_max")),
    ("throughput (tokens/s)", ("perf/generation_tokens_per_s", "perf/train_tokens_per_s")),
    ("idle fraction", ("perf/trainer_idle_fraction", "perf/generator_idle_fraction")),
)


def batch_metrics(trajectories: Sequence[Trajectory], version: int) -> dict[str, float]:
    """Rollout-side scalars of one step's trajectories (failed ones counted, not averaged)."""
    ok = [t for t in trajectories if t.status is TrajectoryStatus.OK]
    out: dict[str, float] = {"rollout/trajectories": float(len(trajectories)),
                             "rollout/failed": float(len(trajectories) - len(ok))}
    for status, n in Counter(t.status.value for t in trajectories if t.status is not TrajectoryStatus.OK).items():
        out[f"rollout/failed_{status}"] = float(n)
    if not ok:
        return out
    rewards = [t.reward for t in ok]
    mean = sum(rewards) / len(rewards)
    out["rollout/reward_mean"] = mean
    out["rollout/reward_std"] = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    successes = [t.metrics["success"] if "success" in t.metrics else float(t.reward > 0) for t in ok]
    out["rollout/success_rate"] = sum(successes) / len(successes)
    out["rollout/response_tokens_mean"] = sum(t.num_sampled for t in ok) / len(ok)
    out["rollout/sequence_tokens_mean"] = sum(len(t) for t in ok) / len(ok)
    out["rollout/turns_mean"] = sum(t.num_turns for t in ok) / len(ok)
    out["rollout/sampled_tokens"] = float(sum(t.num_sampled for t in ok))
    for age, n in sorted(Counter(version - t.oldest_version for t in ok if t.num_sampled).items()):
        out[f"staleness/{age}"] = float(n)  # the histogram: trajectories per age in versions
    parts: dict[str, list[float]] = {}
    for t in ok:
        for k, v in t.metrics.items():
            if k.startswith("reward/"):
                parts.setdefault(k, []).append(v)
    out.update({f"rollout/{k}": sum(v) / len(v) for k, v in parts.items()})
    calls = [t for t in ok if "calls" in t.metrics and "calls_truncated" in t.metrics]
    if calls:  # completions cut at max_new_tokens; a trajectory per call counts each call once
        out["rollout/truncation_rate"] = (sum(t.metrics["calls_truncated"] for t in calls)
                                          / max(1.0, sum(t.metrics["calls"] for t in calls)))
    return out


class RunLog:
    """Writes a run's metrics and samples; see the module docstring. One per run, on rank 0."""

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = True, wandb_project: str | None = None,
                 trajectories_per_step: int = 16, record: bool = False, config: Mapping[str, Any] | None = None,
                 resume_step: int | None = None) -> None:
        """``resume_step``: a resumed run drops what the crashed one logged after that step."""
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        if resume_step is not None and self.metrics_path.exists():
            rows = [r for r in read_metrics(self.run_dir) if r["step"] <= resume_step]
            self.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        self.samples_dir = self.run_dir / "trajectories"
        self.trajectories_per_step = trajectories_per_step
        self.record_dir = self.run_dir / RECORD_DIR if record else None
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tensorboard"),
                                     purge_step=None if resume_step is None else resume_step + 1)
        self._wandb = None
        if wandb_project:
            from agentrl.plugins import import_optional

            wandb = import_optional("wandb", extra="wandb", purpose="logging.wandb_project")
            self._wandb = wandb.init(project=wandb_project, dir=str(self.run_dir), config=dict(config or {}),
                                     name=self.run_dir.name, resume="allow")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        for k, v in row.items():
            if k != "step" and math.isfinite(v):
                if self._tb is not None:
                    self._tb.add_scalar(k, v, step)
        if self._tb is not None:
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(dict(metrics), step=step)

    def sample(self, step: int, trajectories: Sequence[Trajectory], decode: Any,
               extra: Mapping[int, Mapping[str, Any]] | None = None,
               failed: Sequence[Trajectory] = ()) -> Path | None:
        """Keep the first ``trajectories_per_step`` of a step for inspection; ``decode(ids) -> str``
        gives each token's text; ``extra[i]`` adds fields to ``trajectories[i]``'s row: the
        trainer's ``trainer_logprobs`` and ``entropy`` (token-aligned, 0.0 on the first token,
        which nothing predicts) and its ``advantage``. ``failed``: the step's failed episodes (not
        trained on), of which as many again follow, each with its ``status`` and ``error`` — a
        run whose episodes fail shows why where one looks. The file appears whole (written
        aside, then renamed), so a viewer never reads half a step."""
        if self.trajectories_per_step == 0:
            return None
        self.samples_dir.mkdir(exist_ok=True)
        path = self.samples_dir / step_file(step)
        tmp = path.with_suffix(".jsonl.tmp")
        kept = list(trajectories[: self.trajectories_per_step])
        with tmp.open("w") as f:
            for i, t in enumerate([*kept, *failed[: self.trajectories_per_step]]):
                row = t.to_dict()
                row["tokens"] = [decode([tok]) for tok in t.input_ids]
                for key, value in ((extra or {}).get(i, {}) if i < len(kept) else {}).items():
                    row[key] = [float(x) for x in value] if isinstance(value, list) else value
                f.write(json.dumps(row) + "\n")
        os.replace(tmp, path)
        return path

    def record(self, step: int, trajectories: Sequence[Trajectory]) -> Path | None:
        """Write every trajectory of step ``step`` whole — trained, dropped as stale or failed; each
        row a ``Trajectory.to_dict()`` (the episode's environment record on its first trajectory)
        — to ``record/step_NNNNNN.jsonl``, which ``agentrl replay`` re-scores and a run with
        ``rollout.source`` set to this folder trains on. Appears whole (written aside, renamed)."""
        if self.record_dir is None:
            return None
        self.record_dir.mkdir(exist_ok=True)
        path = self.record_dir / step_file(step)
        tmp = path.with_suffix(".jsonl.tmp")
        with tmp.open("w") as f:
            for t in trajectories:
                f.write(json.dumps(t.to_dict(), separators=(",", ":")) + "\n")
        os.replace(tmp, path)
        return path

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(run_dir: str | Path) -> list[dict[str, float]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def plot_curves(run_dir: str | Path, out: str | Path | None = None) -> Path | None:
    """Draw ``curves.png`` from ``metrics.jsonl``; None (with a warning) without matplotlib."""
    try:
        from agentrl.plugins import import_optional

        import_optional("matplotlib", extra="plots", purpose="curves.png")
    except Exception as e:  # a missing plot must not fail a finished run
        warnings.warn(str(e), RuntimeWarning, stacklevel=2)
        return None
    from matplotlib.figure import Figure  # no pyplot: no global state, so any thread may draw

    rows = read_metrics(run_dir)
    panels = [(title, keys) for title, keys in CURVES if any(k in r for r in rows for k in keys)]
    if not panels:
        return None
    cols = 3
    fig = Figure(figsize=(5 * cols, 3.2 * math.ceil(len(panels) / cols)))
    axes = fig.subplots(math.ceil(len(panels) / cols), cols, squeeze=False)
    for ax, (title, keys) in zip(axes.flat, panels, strict=False):
        for key in keys:
            pts = [(r["step"], r[key]) for r in rows if key in r and math.isfinite(r[key])]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker="o" if len(pts) < 30 else None, ms=3, label=key.split("/", 1)[-1])
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    path = Path(out) if out is not None else Path(run_dir) / "curves.png"
    fig.savefig(path, dpi=90)
    return path


if __name__ == "__main__":  # `python -m agentrl.run.metrics RUN_DIR`: redraw curves.png (the loop's plotter)
    import sys

    plot_curves(sys.argv[1])

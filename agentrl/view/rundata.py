"""RunData: the files of one run directory, as the viewer reads them (read-only, while they grow).

What it is: the viewer's only reader of a run. It finds what ``agentrl train`` wrote
(``config.yaml``, ``summary.json``, ``metrics.jsonl``, ``trajectories/step_NNNNNN.jsonl``)
and what ``agentrl eval`` wrote (``eval/eval.jsonl``, or ``eval.jsonl`` in a directory given
with ``--out``). ``metrics.jsonl`` is read incrementally: each call reads only the bytes
appended since the last one, a line still being written is left for the next call, and a
file that shrank (a resumed run rewrites it) is read again from the start. Each trajectory
row gets the fields the page filters on: ``index`` (its line in the step's file), ``env``,
``staleness`` (versions between the policy that sampled its oldest token and the trainer's
version at that step), ``sampled_tokens`` and ``segment``/``segments`` (its place among the
rows of the step that share its ``episode_id``); a step's failed episodes come after its
trained rows, with their ``status`` and ``error``; a row's ``record`` is its episode's
environment inputs and outputs (``agentrl.rollout.record``). ``record(step)`` reads every
trajectory of a step from ``record/step_NNNNNN.jsonl``. A finished evaluation has its report in
``eval_summary.json``.

What it is not: a writer (``agentrl.run.metrics`` writes these files) or the HTTP routes
(``agentrl.view.viewer``). Main hook: ``RunData(path)`` then ``metrics()``, ``steps()``,
``trajectories(step)``, ``record(step)``, ``evaluation()``.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

from agentrl.api import NOT_SAMPLED
from agentrl.errors import ConfigError
from agentrl.rollout.record import RECORD_DIR, step_file

STEP_FILE = re.compile(r"^step_(\d+)\.jsonl$")
TRAINING_FILES = ("metrics.jsonl", "trajectories", "summary.json")
"""What ``agentrl train`` writes; a directory with none of them holds only an evaluation."""


def parse_line(line: str | bytes) -> Any:
    """One JSON line, with NaN and ±Infinity (which ``json.dumps`` writes) read as None."""
    return json.loads(line, parse_constant=lambda _: None)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The complete JSON lines of ``path`` (a torn or unreadable line is skipped)."""
    rows = []
    try:
        text = path.read_text()
    except FileNotFoundError:
        return rows
    for line in text.splitlines():
        try:
            row = parse_line(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


class RunData:
    """One run directory (training, evaluation, or both); see the module docstring."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        if not self.path.is_dir():
            raise ConfigError(f"{str(self.path)!r} is not a directory; give the run_dir of `agentrl train` "
                              "(or the --out directory of `agentrl eval`)")
        if not any((self.path / name).exists() for name in
                   ("metrics.jsonl", "trajectories", "config.yaml", "eval.jsonl", "eval/eval.jsonl")):
            raise ConfigError(f"{str(self.path)!r} holds no run: expected metrics.jsonl, trajectories/ or "
                              "config.yaml (written by `agentrl train`) or eval/eval.jsonl (`agentrl eval`)")
        self.name = self.path.resolve().name
        self._lock = threading.Lock()
        self._rows: list[dict[str, Any]] = []
        self._offset = 0

    # ------------------------------------------------------------------ whole-run facts

    def config(self) -> dict[str, Any]:
        path = self.path / "config.yaml"
        if not path.is_file():
            return {}
        import yaml

        try:
            cfg = yaml.safe_load(path.read_text())
        except yaml.YAMLError:
            return {}
        return cfg if isinstance(cfg, dict) else {}

    def summary(self) -> dict[str, Any]:
        try:
            out = parse_line((self.path / "summary.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return out if isinstance(out, dict) else {}

    def env_id(self, cfg: dict[str, Any] | None = None) -> str:
        """The environment the run's workflow plays (``rollout.workflow_args.env_id``), or ''."""
        rollout = (self.config() if cfg is None else cfg).get("rollout") or {}
        args = rollout.get("workflow_args") or {}
        return str(args.get("env_id") or "")

    def info(self) -> dict[str, Any]:
        cfg = self.config()
        path = self.path / "config.yaml"
        text = path.read_text() if path.is_file() else ""
        return {"name": self.name, "path": str(self.path), "config": cfg, "config_text": text, "summary": self.summary(),
                "env": self.env_id(cfg), "steps": self.steps(), "has_eval": self.eval_path() is not None,
                "has_training": any((self.path / name).exists() for name in TRAINING_FILES),
                "eval_summary": self.eval_summary(), "recorded_steps": self.recorded_steps(),
                "trajectories_per_step": (cfg.get("logging") or {}).get("trajectories_per_step")}

    # ------------------------------------------------------------------ metrics

    def metrics(self, since: int = 0) -> dict[str, Any]:
        """``{"rows": rows[since:], "total": n, "reset": bool}``; ``reset`` says the file was
        rewritten (a resume) and the caller must drop what it has."""
        with self._lock:
            reset = self._read_new_metrics()
        since = 0 if reset else max(0, since)
        return {"rows": self._rows[since:], "total": len(self._rows), "reset": reset}

    def _read_new_metrics(self) -> bool:
        path = self.path / "metrics.jsonl"
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        reset = size < self._offset
        if reset:
            self._rows, self._offset = [], 0
        if size == self._offset:
            return reset
        with path.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read(size - self._offset)
        end = chunk.rfind(b"\n") + 1  # a line still being written waits for the next call
        for line in chunk[:end].splitlines():
            try:
                row = parse_line(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(row, dict) and "step" in row:
                self._rows.append(row)
        self._offset += end
        return reset

    # ------------------------------------------------------------------ trajectories

    def steps(self) -> list[int]:
        """The steps with a trajectory sample, in order."""
        return _step_numbers(self.path / "trajectories")

    def trajectories(self, step: int) -> list[dict[str, Any]]:
        """The sampled trajectories of ``step`` (an unknown step gives [])."""
        rows = read_jsonl(self.path / "trajectories" / step_file(step))
        env = self.env_id()
        for i, row in enumerate(rows):
            row["index"] = i
            row.setdefault("env", env)
            mask = row.get("loss_mask") or []
            versions = [v for v, m in zip(row.get("versions") or [], mask, strict=False) if m and v != NOT_SAMPLED]
            row["sampled_tokens"] = sum(1 for m in mask if m)
            # the trainer held version step-1 when it trained on this row
            row["staleness"] = (step - 1 - min(versions)) if versions else None
        _number_segments(rows)
        return rows

    def record(self, step: int) -> list[dict[str, Any]]:
        """Every trajectory of ``step`` as ``record/step_NNNNNN.jsonl`` holds it (whole, each
        episode's environment record on its first trajectory; [] for an unknown step or a run
        without a record)."""
        rows = read_jsonl(self.path / RECORD_DIR / step_file(step))
        for i, row in enumerate(rows):
            row["index"] = i
        _number_segments(rows)
        return rows

    def recorded_steps(self) -> list[int]:
        """The steps with a record, in order."""
        return _step_numbers(self.path / RECORD_DIR)

    # ------------------------------------------------------------------ evaluation

    def eval_path(self) -> Path | None:
        for path in (self.path / "eval" / "eval.jsonl", self.path / "eval.jsonl"):
            if path.is_file():
                return path
        return None

    def eval_summary(self) -> dict[str, Any]:
        """The report of a finished ``agentrl eval`` (``eval_summary.json`` beside ``eval.jsonl``;
        absent while it runs), or {}."""
        path = self.eval_path()
        try:
            out = parse_line((path.parent / "eval_summary.json").read_text()) if path is not None else {}
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return out if isinstance(out, dict) else {}

    def evaluation(self) -> list[dict[str, Any]]:
        """The problems of ``agentrl eval`` (index, k, successes, failed, row, samples when
        written), sorted by index; [] when the run has no evaluation."""
        path = self.eval_path()
        if path is None:
            return []
        env = self.env_id()
        rows = sorted(read_jsonl(path), key=lambda r: (r.get("k", 0), r.get("index", 0)))
        for r in rows:
            samples = r.get("samples") or []
            for j, s in enumerate(samples):
                s["index"] = j
                s.setdefault("env", env)
                s["sampled_tokens"] = sum(1 for m in s.get("loss_mask") or [] if m)
                s["episode_id"] = s.get("episode_id") or f"{r.get('index')}:{s.get('sample', j)}"
            _number_segments(samples)
        return rows


def _number_segments(rows: list[dict[str, Any]]) -> None:
    """``segment``/``segments``: each row's place among the rows that share its ``episode_id``."""
    per_episode: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        per_episode.setdefault(str(row.get("episode_id", "")), []).append(row)
    for members in per_episode.values():
        for k, row in enumerate(members):
            row["segment"], row["segments"] = k + 1, len(members)


def _step_numbers(folder: Path) -> list[int]:
    """The steps that have a file in ``folder`` (``step_NNNNNN.jsonl``), in order; [] without it."""
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := STEP_FILE.match(p.name)))

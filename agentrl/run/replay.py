"""Re-scoring a finished run's episodes with another reward function, without generating.

What it is: ``replay_rewards(run_dir, reward, out)`` — ``agentrl replay``'s work. It reads every
step of ``RUN_DIR/record/`` (``RunLog.record``: every trajectory whole, each episode's
environment record on its first; ``agentrl.rollout.record``), rebuilds for each episode the
``RewardInput`` its env's rubric scored (the last reply, the task, the transcript, the facts)
and scores it with ``reward`` — a reward function (``RewardInput -> number``, plain or async,
what a ``Reward`` term takes) or a ``Rubric``. It writes the run's rows again with the new
reward on every trajectory of the episode (the return with discount 1), the recorded one kept as
``metrics["replay/recorded_reward"]``, into ``out/step_NNNNNN.jsonl`` — the same shape as
``record/``, so ``rollout.source=OUT`` trains on the re-scored episodes — and counts how many
rewards changed. The run's own files are never written: ``out`` may not be its ``record/``, the
run or a parent of either, and a non-empty ``out`` (an earlier replay's) is replaced only with
``force`` (``agentrl.output_dir``); the rows are written beside it and renamed into place.

Not re-scored (copied, counted as ``unscored``): failed episodes, and episodes whose record was
cut by ``logging.record_max_bytes`` or is absent (a gateway's agents). What it is not: a replay
of the environment (no env is stepped, no sandbox runs: the facts are the recorded ones) or of
generation (``agentrl.rollout.journal`` replays generations for ``--resume``).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError
from agentrl.output_dir import claim_output_dir, replace_dir, staging_dir
from agentrl.rollout.record import reward_input
from agentrl.rollout.recorded import checked_rows, model_vocab_size, recorded_steps


def load_reward(spec: str) -> Callable[[Any], Any]:
    """``MODULE:FN`` as a function of one ``RewardInput`` (a ``Rubric``'s total, for a rubric)."""
    from agentrl.env.rewards import Rubric
    from agentrl.plugins import load_object

    if ":" not in spec:
        raise ConfigError(f"--reward {spec!r}: expected MODULE:FN, e.g. agentrl.env.rewards:boxed_format")
    fn = load_object(spec)
    if isinstance(fn, Rubric):
        async def total(inp: Any, rubric: Rubric = fn) -> float:
            return (await rubric.ascore(inp))[0]
        return total
    if not callable(fn):
        raise ConfigError(f"--reward {spec!r} is a {type(fn).__name__}, not a function or a Rubric")
    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        raise ConfigError(f"--reward {spec!r} takes {inspect.signature(fn)}; a reward function takes one argument, "
                          "a RewardInput (response, task, transcript, facts), and returns a number") from None
    except ValueError:  # no signature to read (a builtin): the call will say
        pass
    return fn


def episodes(rows: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """The rows of one step grouped by episode, in order of first appearance."""
    by_id: dict[str, list[dict[str, Any]]] = {}
    for i, row in enumerate(rows):
        by_id.setdefault(row.get("episode_id") or f"#{i}", []).append(row)
    yield from by_id.values()


async def _score(fn: Callable[[Any], Any], inp: Any, spec: str, where: str) -> float:
    try:
        value = fn(inp)
        if inspect.isawaitable(value):
            value = await value
    except Exception as e:  # the user's function failed: one line naming it and the episode, not a traceback
        raise ConfigError(f"--reward {spec!r} raised {type(e).__name__}: {str(e)[:200]} for {where}") from e
    if isinstance(value, bool):
        value = float(value)
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"--reward {spec!r} returned {value!r:.100} for {where}; a reward is a finite number")
    return float(value)


async def replay_rewards(run_dir: str | Path, spec: str, out: str | Path | None = None, *,
                         force: bool = False) -> dict[str, Any]:
    """Re-score every recorded episode of ``run_dir`` with ``spec`` (``MODULE:FN``); see the module
    doc. Returns the summary: episodes, rescored, changed, unscored, the mean rewards, out."""
    steps = recorded_steps(run_dir)
    fn = load_reward(spec)
    target = claim_output_dir(out if out is not None else Path(run_dir) / "replay" / spec.replace(":", "."),
                              inputs=(steps[0].parent,), force=force)
    tmp = staging_dir(target)
    try:
        summary = await _rescore(steps, fn, spec, tmp, run_vocab_size(run_dir))
        summary["out"] = str(target)
        (tmp / "replay_summary.json").write_text(json.dumps(summary, indent=1, allow_nan=False))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # our own staging directory
        raise
    replace_dir(tmp, target)
    return summary


def run_vocab_size(run_dir: str | Path) -> int | None:
    """The vocabulary size of the model ``RUN_DIR/config.yaml`` names (None: no such run or model)."""
    import yaml

    try:
        return model_vocab_size(yaml.safe_load((Path(run_dir) / "config.yaml").read_text()).get("model"))
    except (OSError, AttributeError, yaml.YAMLError):
        return None


async def _rescore(steps: list[Path], fn: Callable[[Any], Any], spec: str, out: Path,
                   vocab_size: int | None) -> dict[str, Any]:
    counts = {"episodes": 0, "rescored": 0, "changed": 0, "unscored": 0}
    before: list[float] = []
    after: list[float] = []
    for path in steps:
        rows = [row for row, _ in checked_rows(path, vocab_size)]
        for members in episodes(rows):
            counts["episodes"] += 1
            record = next((r.get("record") for r in members if r.get("record")), None)
            try:
                inp = reward_input(record) if record is not None else None
            except (TypeError, ValueError, KeyError, AttributeError) as e:
                raise ConfigError(f"{path}: episode {members[0].get('episode_id')}: its record is not one agentrl "
                                  f"wrote ({type(e).__name__}: {str(e)[:200]})") from None
            if inp is None or any(r.get("status") != "ok" for r in members):
                counts["unscored"] += 1
                continue
            old = float(members[-1]["reward"])
            new = await _score(fn, inp, spec, f"episode {members[0].get('episode_id')} of {path.name}")
            counts["rescored"] += 1
            counts["changed"] += int(new != old)
            before.append(old)
            after.append(new)
            for r in members:
                r["metrics"] = {**r.get("metrics", {}), "replay/recorded_reward": float(r["reward"])}
                r["reward"] = new
        (out / path.name).write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
    return {**counts, "steps": len(steps), "reward": spec,
            "reward_mean_recorded": sum(before) / len(before) if before else None,
            "reward_mean_rescored": sum(after) / len(after) if after else None}


def run_replay(run_dir: str | Path, spec: str, out: str | Path | None = None, *, force: bool = False) -> dict[str, Any]:
    return asyncio.run(replay_rewards(run_dir, spec, out, force=force))

"""EvalConfig: a run's ``eval`` section — held-out evaluation before, during and after training.

What it is: the typed settings of the evaluation ``agentrl.rollout.evaluate`` runs (rows, k,
sampling, the workflow arguments that differ from the rollouts'), and the ``figures`` a run reads
from its scores into ``summary.json`` (``figure_value``), checked against the score names that
``EvalReport.summary()`` gives (``EVAL_SCORE``). What it is not: the evaluation itself
(``agentrl.rollout.evaluate``) or the run config that composes it (``agentrl.run.run_config``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from agentrl.api import SamplingParams
from agentrl.config import option
from agentrl.errors import ConfigError

EVAL_SCORE = re.compile(r"pass@\d+(_ci95)?|problems|failed_episodes|(episodes|successes)/reward/\S+")
"""The keys of ``EvalReport.summary()``: what ``eval.figures`` may name."""


def figure_scores(figure: str) -> list[str]:
    """The scores an ``eval.figures`` value names: ``[SCORE]``, or ``[A, B]`` for ``A / B``."""
    return [part.strip() for part in figure.split(" / ")]


def figure_value(figure: str, scores: dict[str, float]) -> float | None:
    """An ``eval.figures`` value read from an evaluation's scores: a score, or the ratio ``A / B``
    (e.g. the share of first-wrong episodes fixed: ``episodes/reward/fixed / episodes/reward/first_wrong``);
    None when a score is absent (no episode reported it) or the divisor is 0."""
    parts = [scores.get(part) for part in figure_scores(figure)]
    if any(v is None for v in parts):
        return None
    if len(parts) == 1:
        return parts[0]
    return parts[0] / parts[1] if parts[1] else None


@dataclass
class EvalConfig:
    """Held-out evaluation (greedy by default) before training, every N steps, and at the end."""

    dataset: str | None = option(None, help="rows to evaluate on (like rollout.dataset); none: no evaluation")
    limit: int | None = option(None, ge=1, help="evaluate on the first N rows only")
    every_steps: int = option(0, ge=0, help="evaluate every N steps too (0: only before and after)")
    k: int = option(1, ge=1, help="samples per problem (pass@k for every k' <= k is reported)")
    workflow_args: dict[str, Any] = option({}, help="workflow arguments that differ for evaluation")
    figures: dict[str, str] = option({}, help="summary keys read from the evaluation's scores: NAME: SCORE puts "
                                             "SCORE of the first evaluation in NAME_before and of the last in NAME_after "
                                             "(as eval_before and eval_after), "
                                             "e.g. {tool_use_rate: successes/reward/used_tool_result}; SCORE / SCORE "
                                             "is their ratio, e.g. {fixed: episodes/reward/fixed / "
                                             "episodes/reward/first_wrong}")
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(max_new_tokens=256, temperature=0.0),
                                     metadata={"help": "sampling for evaluation (greedy by default)"})

    def __post_init__(self) -> None:
        for name, score in self.figures.items():  # a misspelt score would read None at every evaluation
            parts = figure_scores(str(score))
            if len(parts) > 2 or not all(EVAL_SCORE.fullmatch(part) for part in parts):
                raise ConfigError(f"config key 'eval.figures.{name}': got {score!r}, expected an evaluation score: "
                                  "pass@K, pass@K_ci95, problems, failed_episodes, episodes/reward/NAME or "
                                  "successes/reward/NAME (NAME: a reward term of the env), or two of them as "
                                  "SCORE / SCORE")

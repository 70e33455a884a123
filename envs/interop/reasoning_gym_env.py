"""reasoning-gym's procedural tasks as agentrl environments: ``reasoning_gym/<task>``.

What it is: ``ReasoningGymEnv``, one reasoning-gym dataset (``reasoning_gym.create_dataset``)
played as a one-turn text env, scored by the dataset's own ``score_answer``; ``register``
(called by ``agentrl.plugins.find_env`` for ``reasoning_gym/...`` ids), ``listing`` (the line
of ``agentrl envs``) and the row functions ``train_rows`` / ``eval_rows`` for
``rollout.dataset`` / ``eval.dataset``. The tasks come with the env: a row names a split and
an index, ``{"split": "train", "index": 7}``, and the env generates that entry from its own
seeded generator; the two splits draw from disjoint generator seeds (reasoning-gym seeds entry
``i`` of a dataset with ``seed + i``: train uses ``[seed, seed + size)``, eval the
``eval_size`` seeds after it). A row may also be a whole entry (``question``, ``answer``,
``metadata``), as reasoning-gym writes them.

What it is not: a curriculum (reasoning-gym's ``create_curriculum``) or a composite of tasks;
the config of a task is fixed per env (``env_kwargs: {config: {...}}``).

Main hook::

    rollout: {workflow_args: {env_id: reasoning_gym/chain_sum, env_kwargs: {config: {max_terms: 3}}},
              dataset: envs.interop.reasoning_gym_env:train_rows}
    eval:    {dataset: envs.interop.reasoning_gym_env:eval_rows}
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import Any

from agentrl.api import Message
from agentrl.env import EpisodeLimits, Reward, Rubric, TextEnv, Turn, fact
from agentrl.errors import EnvError
from agentrl.plugins import import_optional
from envs.interop import register_named

ID_FORM = "reasoning_gym/<task>"
PREFIX = "reasoning_gym/"
EXTRA = "reasoning-gym"
TRAIN_SIZE = 10_000
"""Entries of the train split by default (``env_kwargs: {size: N}``); ``train_rows`` gives this many."""
EVAL_SIZE = 500
"""Entries of the eval split by default (``env_kwargs: {eval_size: N}``); ``eval_rows`` gives this many."""
ANSWER_FORMATS = ("auto", "answer_tag", "boxed", "raw")


def _package() -> Any:
    return import_optional("reasoning_gym", extra=EXTRA, purpose="the reasoning_gym/... environments")


def tasks() -> list[str]:
    """Every task reasoning-gym registers (``reasoning_gym/<task>`` for each)."""
    return sorted(_package().factory.DATASETS)


def register(env_id: str) -> str:
    """Register ``reasoning_gym/<task>`` with gymnasium (its entry point: ``ReasoningGymEnv``)."""
    task, names = env_id.removeprefix(PREFIX), tasks()
    return register_named(env_id, PREFIX, task, names, "reasoning-gym has no task", f"{__name__}:ReasoningGymEnv",
                          {"task": task}, f"`agentrl envs` counts its {len(names)} tasks (reasoning_gym.factory.DATASETS)")


def listing() -> str:
    """The line of ``agentrl envs``: the version and tasks installed, or the extra to install."""
    try:
        import reasoning_gym
    except ModuleNotFoundError:
        return f"reasoning-gym's procedural tasks; not installed: pip install 'agentrl[{EXTRA}]'"
    from importlib.metadata import version

    names = sorted(reasoning_gym.factory.DATASETS)
    return (f"reasoning-gym {version('reasoning_gym')}: {len(names)} procedural tasks "
            f"({', '.join(names[:4])}, ...), scored by each task's score_answer")


def train_rows(seed: int, n: int = TRAIN_SIZE) -> list[dict[str, Any]]:
    """Rows of the train split (``rollout.dataset``): every index of a default-size split."""
    return [{"split": "train", "index": i} for i in range(n)]


def eval_rows(seed: int, n: int = EVAL_SIZE) -> list[dict[str, Any]]:
    """Rows of the eval split (``eval.dataset``), the same whatever the run's seed."""
    return [{"split": "eval", "index": i} for i in range(n)]


def extract_answer(reply: str, answer_format: str = "auto") -> str | None:
    """The answer a reply gives: the last ``\\boxed{...}``, else the last ``<answer>...</answer>``
    (reasoning-gym's own format), else the whole reply (``auto``); or only one of them."""
    if answer_format in ("auto", "boxed"):
        boxed = _last_boxed(reply)
        if boxed is not None or answer_format == "boxed":
            return boxed
    if answer_format in ("auto", "answer_tag"):
        tags = re.findall(r"<answer>\s?(.*?)\s?</answer>", reply, flags=re.DOTALL)
        if tags or answer_format == "answer_tag":
            return tags[-1].strip() if tags else None
    return reply.strip() or None


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


class ReasoningGymEnv(TextEnv):
    """One reasoning-gym task (``reasoning_gym/<task>``), answered in one turn.

    ## Description
    The question of a reasoning-gym entry (``reasoning_gym.create_dataset(task, ...)[i]``), as
    the user turn (after ``system_prompt`` when given). The reply's answer is scored by the
    dataset's own ``score_answer(answer, entry)``.

    ## Action Space
    ``Text``: the assistant's reply.

    ## Observation Space
    ``Messages``. Reset: the system prompt (when set) and the question. The step returns ``[]``.

    ## Starting State
    ``options["task"]``: ``{"split": "train"|"eval", "index": i}`` (entry ``i`` of that split) or a
    whole entry ``{"question", "answer", "metadata"}``; without one, a train index drawn from
    the seeded ``np_random``.

    ## Rewards
    ``score`` (weight 1): reasoning-gym's ``score_answer``, in [0, 1] (some tasks give partial
    credit; a few score their own gold answer below 1 where several answers are valid). A scorer
    that raises on the model's answer scores 0 (``score_error`` says why). ``judge`` (optional,
    its ``weight``): an LLM's grade of the reply by a rubric prompt.

    ## Episode End
    Terminated after the first reply. Truncated only by ``max_tokens`` or ``max_wall_s``.

    ## Information
    Step: ``score``, ``correct`` (score >= 1), ``answer`` (the answer read, or None), ``rewards``.

    ## Arguments
    ``task`` (set by the id), ``config`` (the task's own config keys, e.g. ``{"max_terms": 3}``),
    ``size`` (10000) and ``seed`` (0): the train split; ``eval_size`` (500): the eval split, on the
    generator seeds after the train split's; ``system_prompt``: None, a key of
    ``reasoning_gym.utils.SYSTEM_PROMPTS`` ("default", "direct", ...) or the text itself;
    ``answer_format``: auto, answer_tag, boxed or raw; ``judge``: an LLM-as-judge term
    (``agentrl.env.judge.JudgeConfig``'s fields and its ``weight``); ``max_tokens``; ``max_wall_s``;
    ``render_mode``.

    ## Version History
    * v0: initial version (reasoning-gym 0.1.25).
    """

    def __init__(self, task: str, config: Mapping[str, Any] | None = None, size: int = TRAIN_SIZE, seed: int = 0,
                 eval_size: int = EVAL_SIZE, system_prompt: str | None = None, answer_format: str = "auto",
                 judge: Mapping[str, Any] | None = None, max_tokens: int | None = None,
                 max_wall_s: float | None = None, render_mode: str | None = None) -> None:
        terms = [Reward("score", fact("score"))]
        if judge:  # an LLM grades the reply by a rubric prompt, beside the task's own score
            from agentrl.env.judge import judge_from

            judge = dict(judge)
            weight = float(judge.pop("weight", 1.0))
            terms.append(Reward("judge", judge_from(judge), weight))
        super().__init__(rubric=Rubric(terms),
                         limits=EpisodeLimits(max_turns=1, max_tokens=max_tokens, max_wall_s=max_wall_s),
                         render_mode=render_mode)
        rg = _package()
        if answer_format not in ANSWER_FORMATS:
            raise EnvError(f"answer_format must be one of {ANSWER_FORMATS}, got {answer_format!r}")
        if size < 1 or eval_size < 1:
            raise EnvError(f"size and eval_size must be >= 1, got {size=}, {eval_size=}")
        config = dict(config or {})
        clash = sorted({"seed", "size"} & set(config))
        if clash:
            raise EnvError(f"give {clash} as env_kwargs of their own, not inside config (they set the splits)")
        try:
            self.splits = {"train": rg.create_dataset(task, size=size, seed=seed, **config),
                           "eval": rg.create_dataset(task, size=eval_size, seed=seed + size, **config)}
        except (TypeError, ValueError, AssertionError) as e:
            raise EnvError(f"reasoning-gym task {task!r} refused config {config}: {type(e).__name__}: {e}") from e
        prompts = rg.utils.SYSTEM_PROMPTS
        self.system_prompt = prompts.get(system_prompt, system_prompt) if system_prompt else None
        self.task_name = task
        self.answer_format = answer_format
        self._entry: dict[str, Any] = {}

    def sample_task(self) -> dict[str, Any]:
        return {"split": "train", "index": int(self.np_random.integers(len(self.splits["train"])))}

    async def _start(self, task: dict[str, Any]) -> list[Message]:
        if {"question", "answer"} <= set(task):
            self._entry = task
        else:
            split, index = task.get("split", "train"), task.get("index")
            if split not in self.splits or not isinstance(index, int) or not 0 <= index < len(self.splits[split]):
                size_key = "size" if split == "train" else "eval_size"
                raise EnvError(f"a {PREFIX}{self.task_name} row is {{'split': 'train'|'eval', 'index': i}} with "
                               f"0 <= i < the split's size (env_kwargs {size_key!r}), or a whole entry; got {task}")
            self._entry = await asyncio.to_thread(self.splits[split].__getitem__, index)
            task.update(question=str(self._entry["question"]), answer=str(self._entry["answer"]))  # for a judge
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": str(self._entry["question"])}]

    async def _turn(self, action: str) -> Turn:
        answer = extract_answer(action, self.answer_format)
        facts: dict[str, Any] = {"answer": answer}
        try:  # the scorer's own code on the model's answer: a crash there is the answer's score, 0
            score = float(await asyncio.to_thread(self.splits["train"].score_answer, answer=answer,
                                                  entry=self._entry))
        except Exception as e:
            score, facts["score_error"] = 0.0, f"{type(e).__name__}: {e}"[:300]
        facts.update(score=score, correct=score >= 1.0)
        return Turn([], done=True, facts=facts)

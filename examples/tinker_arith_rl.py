"""The cookbook's RL trainer on the tiny model's own task, against ``agentrl service``.

Runs in the SDK's environment (``make tinker`` makes ``.venv-tinker``) with the worktree on
``PYTHONPATH`` (for ``agentrl.model.arith_data``, which needs neither torch nor transformers).
The loop, the sampling, the advantages (group-centred rewards), the loss call and the held-out
evaluation are the cookbook's own (``tinker_cookbook.rl.train.main``, its ``ProblemEnv`` and
``RLTestSetEvaluator``); what this file adds is the task: ``a+b+c`` problems of the RL pool of
``agentrl.model.arith_data`` (``What is 17+72+97?``, answered ``\\boxed{186}``), the format the
tiny model was trained on, and a test set of the evaluation pool, which the RL pool never
shares. The renderer is the tiny model's chat format (``examples/tinker_cookbook_tiny.py``).

The cookbook's ``math_rl`` arithmetic env asks ``What is 17 + 72?`` after a few-shot turn that
answers ``9`` with no box, a format the tiny model rarely answers right: most groups of its
samples hold no correct answer and the loss has little to push. LoRA on a 1.2M-parameter model
also wants a small learning rate (1e-4 here; figures in benchmarks/RESULTS.md, "The trainer as
a service"). Usage (every field of ``Run`` as ``key=value``; ``terms=2`` trains ``a+b``)::

    PYTHONPATH=$PWD TINKER_BASE_URL=http://127.0.0.1:8000 TINKER_API_KEY=tml-... \\
        .venv-tinker/bin/python examples/tinker_arith_rl.py model_name=$PWD/examples/tiny-model \\
        log_path=runs/cookbook-arith-own max_steps=40
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import chz
from tinker_cookbook import renderers
from tinker_cookbook.rl import train
from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, RLDatasetBuilder
from tinker_cookbook.tokenizer_utils import get_tokenizer

from agentrl.model.arith_data import extract_answer, generate_problems

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tinker_cookbook_tiny import register  # noqa: E402  (the tiny model's renderer)


class TinyArithEnv(ProblemEnv):
    """One ``a+b+c`` question; correct when the reply's last ``\\boxed{}`` holds the sum."""

    def __init__(self, question: str, answer: int, renderer: renderers.Renderer) -> None:
        super().__init__(renderer, format_coef=0.0)
        self.question, self.answer = question, answer

    def get_question(self) -> str:
        return self.question

    def check_answer(self, sample_str: str) -> bool:
        return extract_answer(sample_str) == self.answer

    def check_format(self, sample_str: str) -> bool:
        return extract_answer(sample_str) is not None

    def get_reference_answer(self) -> str:
        return str(self.answer)


class ArithDataset(RLDataset):
    """Batches of ``groups`` problems, each a group of ``group_size`` samples."""

    def __init__(self, split: str, seed: int, batches: int, groups: int, group_size: int,
                 renderer: renderers.Renderer, terms: int = 3) -> None:
        self.problems = generate_problems(batches * groups, seed=seed, split=split, num_terms=(terms,))
        self.groups, self.group_size, self.renderer, self.batches = groups, group_size, renderer, batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        chunk = self.problems[index * self.groups:(index + 1) * self.groups]
        return [ProblemGroupBuilder(env_thunk=partial(TinyArithEnv, p.question, p.answer, renderer=self.renderer),
                                    num_envs=self.group_size) for p in chunk]

    def __len__(self) -> int:
        return self.batches


@chz.chz
class ArithBuilder(RLDatasetBuilder):
    """The RL pool for training, the evaluation pool (``test_problems`` of it) for the test set."""

    model_name: str
    renderer_name: str
    groups_per_batch: int
    group_size: int
    batches: int
    test_problems: int
    terms: int = 3
    seed: int = 0

    async def __call__(self) -> tuple[RLDataset, RLDataset]:
        renderer = renderers.get_renderer(self.renderer_name, tokenizer=get_tokenizer(self.model_name))
        return (ArithDataset("rl", 1_000_003 + self.seed, self.batches, self.groups_per_batch, self.group_size,
                             renderer, self.terms),
                ArithDataset("eval", 0, 1, self.test_problems, 1, renderer, self.terms))


@chz.chz
class Run:
    """The run's settings; ``terms``: 3 for ``a+b+c`` (the demo task), 2 for ``a+b``."""

    model_name: str
    log_path: str
    learning_rate: float = 1e-4
    lora_rank: int = 16
    group_size: int = 16
    groups_per_batch: int = 8
    max_steps: int = 40
    max_tokens: int = 12
    eval_every: int = 10
    save_every: int = 10
    test_problems: int = 400
    loss_fn: str = "importance_sampling"
    terms: int = 3
    seed: int = 0


def config(run: Run) -> train.Config:
    renderer = register()
    builder = ArithBuilder(model_name=run.model_name, renderer_name=renderer, groups_per_batch=run.groups_per_batch,
                           group_size=run.group_size, batches=run.max_steps, test_problems=run.test_problems,
                           terms=run.terms, seed=run.seed)
    return train.Config(learning_rate=run.learning_rate, dataset_builder=builder, model_name=run.model_name,
                        recipe_name="agentrl_tiny_arith", max_tokens=run.max_tokens, log_path=run.log_path,
                        eval_every=run.eval_every, save_every=run.save_every, renderer_name=renderer,
                        lora_rank=run.lora_rank, loss_fn=run.loss_fn, max_steps=run.max_steps,
                        base_url=os.environ.get("TINKER_BASE_URL"))


if __name__ == "__main__":
    asyncio.run(train.main(config(chz.entrypoint(Run))))

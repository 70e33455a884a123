"""tinker-cookbook 0.6.1's own training loops against `agentrl service`, a few steps each; runs in .venv-tinker.

    TINKER_BASE_URL=... TINKER_API_KEY=tml-... .venv-tinker/bin/python cookbook_runs.py MODEL_DIR OUT_DIR

1. RL: the ``math_rl`` recipe with its ``arithmetic`` env (``recipes/math_rl/train.py``'s
   ``cli_main``, as its command line calls it), with the tiny model's own chat format as a
   renderer (``examples/tinker_cookbook_tiny.py``, registered through the cookbook's
   ``register_renderer``: the tiny model is in no renderer table of the cookbook) and
   ``importance_sampling`` (the recipe's default, ``stable_reinforce``, is not served).
2. SL: the cookbook's supervised trainer (``supervised/train.py``, what ``chat_sl`` runs) on a
   JSONL file of conversations through its ``FromConversationFileBuilder`` (one batch of all
   twelve, three epochs: the same batch each step, so its loss must fall). ``recipes/sl_loop.py``
   itself cannot run here: it loads ``HuggingFaceH4/no_robots`` from the Hub and looks its model
   up in the cookbook's table of named models.

3. ``examples/tinker_arith_rl.py``: the cookbook's RL trainer (``rl/train.py``) on the tiny
   model's own ``a+b+c`` task, with the cookbook's held-out evaluation, one step.

Prints one JSON line: each run's metrics per step.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "examples"), str(ROOT)]  # the examples; agentrl.model.arith_data for tinker_arith_rl
from tinker_cookbook_tiny import register  # noqa: E402  (the renderer, registered with the cookbook)

RENDERER = register()


def metrics(log_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def rl(model: str, out: Path) -> list[dict]:
    from tinker_cookbook.recipes.math_rl.train import CLIConfig, cli_main

    config = CLIConfig(model_name=model, renderer_name=RENDERER, env="arithmetic", group_size=4,
                       groups_per_batch=2, max_steps=2, max_tokens=12, loss_fn="importance_sampling",
                       learning_rate=1e-3, lora_rank=8, log_path=str(out / "rl"), eval_every=0, save_every=0,
                       behavior_if_log_dir_exists="delete", base_url=os.environ["TINKER_BASE_URL"])
    asyncio.run(cli_main(config))
    return metrics(out / "rl")


def sl(model: str, out: Path) -> list[dict]:
    from tinker_cookbook.supervised import train
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    data = out / "conversations.jsonl"
    with data.open("w") as f:
        for a in range(12):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"What is {a} + {a + 1}?"},
                                             {"role": "assistant", "content": str(2 * a + 1)}]}) + "\n")
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=model, renderer_name=RENDERER,
                                            max_length=256, batch_size=12)
    config = train.Config(log_path=str(out / "sl"), model_name=model, recipe_name="agentrl_test", renderer_name=RENDERER,
                          dataset_builder=FromConversationFileBuilder(file_path=str(data), common_config=common),
                          learning_rate=5e-3, num_epochs=3, lora_rank=8, max_steps=3, save_every=0, eval_every=0,
                          base_url=os.environ["TINKER_BASE_URL"])
    asyncio.run(train.main(config))
    return metrics(out / "sl")


def own(model: str, out: Path) -> list[dict]:
    """examples/tinker_arith_rl.py: the cookbook's RL trainer on the tiny model's own task, with
    its held-out evaluation, one step."""
    import tinker_arith_rl
    from tinker_cookbook.rl import train

    run = tinker_arith_rl.Run(model_name=model, log_path=str(out / "own"), group_size=2, groups_per_batch=2,
                              max_steps=1, eval_every=1, save_every=0, test_problems=4)
    asyncio.run(train.main(tinker_arith_rl.config(run)))
    return metrics(out / "own")


if __name__ == "__main__":
    model_dir, out_dir = sys.argv[1], Path(sys.argv[2])
    print(json.dumps({"rl": rl(model_dir, out_dir), "sl": sl(model_dir, out_dir), "own": own(model_dir, out_dir)}),
          flush=True)
    os._exit(0)  # the SDK's background threads: see sdk_calls.py

"""SkyRL-Gym's environments as agentrl environments: ``skyrl_gym/<id>``, rows from ``rollout.dataset``.

What it is: ``SkyRLGymEnv``, one SkyRL-Gym env (``skyrl_gym.make(id, env_config=DictConfig,
extras=row)``) per episode behind the TextEnv protocol; ``register`` / ``listing`` for
``agentrl.plugins.find_env`` and ``agentrl envs``; ``gsm8k_rows`` (the GSM8K test set shipped in
``data/``, in SkyRL's row format). A row is SkyRL's: ``prompt`` (chat messages), ``reward_spec``
(``{"ground_truth": ...}``), ``extra_info`` and the env's own fields (``db_id``, ``data`` for
``text2sql``); everything but ``prompt`` and ``env_class`` goes to the env as ``extras``, as SkyRL's
generator passes it. The env's ``init(prompt)`` gives the opening messages; each ``step(reply)``
gives ``observations``, ``reward`` and ``done`` — its own turn count and end are kept, agentrl's
``max_turns``/``max_tokens``/``max_wall_s`` are added on top. The episode's reward is the sum of
the env's step rewards (SkyRL's turn-level rewards summed: the return of the episode).

Sample rows, for ``agentrl envs check`` with no other argument: ``gsm8k``, ``gsm8k_multi_turn``
(GSM8K test rows from ``data/``), ``aime`` (AIME 2024 from ``data/``) and ``text2sql`` (a small
sqlite database written to a temporary folder, with four questions). ``lcb``, ``search`` and
``searchcode`` need rows (tests to run, a retrieval server) and have none.

What it is not: SkyRL's generator (its batching and token handling are agentrl's here), nor a
sandbox: ``lcb`` runs the model's code in a child process of this one behind SkyRL's own
reliability guard, and ``text2sql`` runs its SQL on the database file — not in agentrl's sandboxes.
"""

from __future__ import annotations

import asyncio
import functools
import re
import sqlite3
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl.api import Message
from agentrl.env import EpisodeLimits, Reward, Rubric, TextEnv, Turn, data_path, fact, load_rows
from agentrl.errors import EnvError
from agentrl.plugins import import_optional
from envs.interop import register_named

ID_FORM = "skyrl_gym/<id>"
PREFIX = "skyrl_gym/"
EXTRA = "skyrl-gym"
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
"""What SkyRL's GSM8K preprocessing appends to each question."""


def _package() -> Any:
    return import_optional("skyrl_gym", extra=EXTRA, purpose="the skyrl_gym/... environments")


def env_names() -> list[str]:
    """The ids SkyRL-Gym registers (``skyrl_gym/<id>`` for each)."""
    return sorted(_package().envs.registration.registry)


def register(env_id: str) -> str:
    name, names = env_id.removeprefix(PREFIX), env_names()
    return register_named(env_id, PREFIX, name, names, "SkyRL-Gym has no env", f"{__name__}:SkyRLGymEnv",
                          {"name": name}, f"it has {names}")


def listing() -> str:
    try:
        import skyrl_gym  # noqa: F401
    except ModuleNotFoundError:
        return f"SkyRL-Gym's envs; not installed: pip install 'agentrl[{EXTRA}]'"
    from importlib.metadata import version

    return (f"SkyRL-Gym {version('skyrl-gym')}: {', '.join(env_names())}; rows from rollout.dataset "
            f"(sample rows for {', '.join(sorted(SAMPLES))})")


# --------------------------------------------------------------------------- rows


def gsm8k_rows(seed: int = 0, limit: int | None = None, env_class: str = "gsm8k") -> list[dict[str, Any]]:
    """The GSM8K test set shipped in ``data/``, as SkyRL's GSM8K rows (``rollout.dataset``)."""
    rows = []
    for r in load_rows(data_path("gsm8k_test.jsonl"), limit=limit):
        answer = r["answer"].split("####")[-1].strip().replace(",", "")
        rows.append({"prompt": [{"role": "user", "content": f"{r['question']} {GSM8K_INSTRUCTION}"}],
                     "env_class": env_class, "reward_spec": {"method": "rule", "ground_truth": answer},
                     "extra_info": {"index": r.get("idx", len(rows))}})
    return rows


def gsm8k_multi_turn_rows(seed: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
    """``gsm8k_rows`` for ``skyrl_gym/gsm8k_multi_turn``."""
    return gsm8k_rows(seed, limit, env_class="gsm8k_multi_turn")


def aime_rows(seed: int = 0) -> list[dict[str, Any]]:
    """AIME 2024 from ``data/``, as SkyRL's AIME rows (its env reads ``reward_model``, not ``reward_spec``)."""
    return [{"prompt": [{"role": "user", "content": r["question"]}], "env_class": "aime",
             "reward_model": {"ground_truth": str(r["answer"])}, "extra_info": {}}
            for r in load_rows(data_path("aime24_test.jsonl"))]


SAMPLE_DB = "agentrl_sample"
SAMPLE_SQL = [
    ("How many customers are there?", "SELECT COUNT(*) FROM customers"),
    ("Which customer lives in Lyon?", "SELECT name FROM customers WHERE city = 'Lyon'"),
    ("What is the total amount of all orders?", "SELECT SUM(amount) FROM orders"),
    ("How many orders did Ada place?",
     "SELECT COUNT(*) FROM orders JOIN customers ON orders.customer_id = customers.id WHERE customers.name = 'Ada'"),
]


def write_sample_db(root: str | Path, db_id: str = SAMPLE_DB) -> Path:
    """A small sqlite database in SkyRL's spider layout: ``ROOT/spider/database/DB/DB.sqlite``."""
    path = Path(root) / "spider" / "database" / db_id / f"{db_id}.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as db:
        db.executescript("""
            DROP TABLE IF EXISTS customers; DROP TABLE IF EXISTS orders;
            CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, city TEXT);
            CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER, amount REAL);
            INSERT INTO customers VALUES (1, 'Ada', 'London'), (2, 'Grace', 'Lyon'), (3, 'Alan', 'Paris');
            INSERT INTO orders VALUES (1, 1, 10.5), (2, 1, 4.5), (3, 2, 7.0), (4, 3, 1.0);
        """)
    db.close()
    return path


def text2sql_rows(questions=SAMPLE_SQL, db_id: str = SAMPLE_DB) -> list[dict[str, Any]]:
    """SkyRL text2sql rows (``data: spider``) on ``db_id``: the question, its gold SQL."""
    schema = ("customers(id INTEGER, name TEXT, city TEXT); orders(id INTEGER, customer_id INTEGER, amount REAL)")
    return [{"prompt": [{"role": "system", "content": "Answer with SQL. Think in <think>...</think>, run a query "
                                                     "with <sql>...</sql>, end with <solution>SQL</solution>."},
                        {"role": "user", "content": f"Database schema: {schema}\nQuestion: {q}"}],
             "env_class": "text2sql", "db_id": db_id, "data": "spider",
             "reward_spec": {"method": "rule", "ground_truth": sql}, "extra_info": {}} for q, sql in questions]


@functools.cache
def _sample_db_root() -> str:
    root = tempfile.mkdtemp(prefix="agentrl-skyrl-sql-")
    write_sample_db(root)
    return root


SAMPLES = {"gsm8k": lambda: gsm8k_rows(limit=200), "gsm8k_multi_turn": lambda: gsm8k_multi_turn_rows(limit=200),
           "aime": aime_rows, "text2sql": text2sql_rows}
"""The sample rows of each env that has them (``agentrl envs check`` and reset without a row)."""


# --------------------------------------------------------------------------- the env


class SkyRLGymEnv(TextEnv):
    """One SkyRL-Gym env (``skyrl_gym/<id>``), built on each row.

    ## Description
    SkyRL-Gym's env ``id`` made for the row (``skyrl_gym.make(id, env_config, extras=row)``): its
    ``init`` gives the opening messages, its ``step`` answers each reply.

    ## Action Space
    ``Text``: the assistant's reply.

    ## Observation Space
    ``Messages``: reset, the row's prompt as the env's ``init`` returns it; a step, the env's
    ``observations`` (chat messages: tool output, feedback).

    ## Starting State
    ``options["task"]``: a SkyRL row (``prompt``, ``reward_spec``, ``extra_info``, the env's
    fields); else a sample row (``SAMPLES``) drawn with the seeded ``np_random``.

    ## Rewards
    ``reward`` (weight 1): the sum of the env's step rewards (its turn-level rewards), given on the
    step that ends the episode.

    ## Episode End
    Terminated when the env says ``done``; truncated by ``max_turns``, ``max_tokens`` or ``max_wall_s``.

    ## Information
    Step: ``step_reward`` (the env's reward for this step), ``return`` (their sum so far), ``rewards``.

    ## Arguments
    ``name`` (set by the id); ``env_config`` (a mapping, made a DictConfig: ``{"db_path": ...}`` for
    text2sql); ``max_turns`` (20); ``max_tokens``; ``max_wall_s``; ``render_mode``.

    ## Version History
    * v0: initial version (skyrl-gym 0.4.0).
    """

    def __init__(self, name: str, env_config: Mapping[str, Any] | None = None, max_turns: int = 20,
                 max_tokens: int | None = None, max_wall_s: float | None = None,
                 render_mode: str | None = None) -> None:
        super().__init__(rubric=Rubric([Reward("reward", fact("return"))]),
                         limits=EpisodeLimits(max_turns=max_turns, max_tokens=max_tokens, max_wall_s=max_wall_s),
                         render_mode=render_mode)
        self.skyrl = _package()
        self.name = name
        self.env_config = dict(env_config or {})
        self.inner: Any = None
        self._return = 0.0

    def sample_task(self) -> dict[str, Any]:
        if self.name not in SAMPLES:
            raise EnvError(f"skyrl_gym/{self.name} has no sample rows here (it needs rows of its own: tests to "
                           f"run, a server to ask); give rows with rollout.dataset. Sample rows: {sorted(SAMPLES)}")
        rows = SAMPLES[self.name]()
        if self.name == "text2sql" and "db_path" not in self.env_config:
            self.env_config["db_path"] = _sample_db_root()
        return self.pick(rows)

    async def _start(self, task: dict[str, Any]) -> list[Message]:
        from omegaconf import OmegaConf

        if task.get("env_class", self.name) != self.name:
            raise EnvError(f"the row's env_class {task['env_class']!r} is not skyrl_gym/{self.name}'s")
        prompt = task.get("prompt")
        if not isinstance(prompt, list):
            raise EnvError(f"a SkyRL row has 'prompt' (a list of chat messages); got keys {sorted(task)}")
        extras = {k: v for k, v in task.items() if k not in ("prompt", "env_class")}
        extras.setdefault("extra_info", {})
        config = OmegaConf.create(self.env_config)

        def make() -> Any:
            try:
                env = self.skyrl.make(self.name, env_config=config, extras=extras)
            except FileNotFoundError as e:
                raise EnvError(f"skyrl_gym/{self.name}: {e} (set env_kwargs env_config.db_path, or the row's "
                               "fields, to where the data is)") from e
            except (AssertionError, KeyError) as e:
                raise EnvError(f"skyrl_gym/{self.name} refused the row: {type(e).__name__}: {e}") from e
            return env, env.init(prompt)

        self.inner, (messages, _) = await asyncio.to_thread(make)
        self._return = 0.0
        return [_message(m) for m in messages]

    async def _turn(self, action: str) -> Turn:
        out = await asyncio.to_thread(self.inner.step, action)
        reward = float(out.get("reward") or 0.0)
        self._return += reward
        messages = [_message(m) for m in out.get("observations") or []]
        return Turn(messages, done=bool(out.get("done")), facts={"step_reward": reward, "return": self._return})

    async def _end(self) -> None:
        inner, self.inner = self.inner, None
        if inner is not None:
            await asyncio.to_thread(inner.close)


def _message(m: Any) -> Message:
    """A SkyRL message as ours: role and string content (OpenAI's other keys kept where ours has them)."""
    if not isinstance(m, Mapping) or "role" not in m:
        raise EnvError(f"SkyRL-Gym gave {m!r:.200} where a chat message ({{'role', 'content'}}) belongs")
    role = m["role"] if m["role"] in ("system", "user", "assistant", "tool") else "user"
    content = m.get("content")
    return {"role": role, "content": content if isinstance(content, str) else re.sub(r"\s+", " ", str(content))}

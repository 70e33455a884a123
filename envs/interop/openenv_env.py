"""OpenEnv environments as agentrl environments: ``openenv:<URL>`` (a server) or ``openenv:<module>:<Class>``.

What it is: ``OpenEnvEnv``, one OpenEnv ``Environment`` behind the TextEnv protocol — a running
server reached through OpenEnv's own ``GenericEnvClient`` (its WebSocket session, one per
episode), or the class itself, made and stepped in this process; ``register`` / ``listing`` for
``agentrl.plugins.find_env`` and ``agentrl envs`` (the id is registered as ``openenv/<slug>``, since
a URL is no Gymnasium name); ``train_rows`` / ``eval_rows`` (rows are reset seeds, disjoint).

A server serves as many sessions at once as it declares (OpenEnv's ``create_app`` serves one
unless the environment supports more): an episode whose server is full waits for a session
(``CAPACITY_REACHED`` is asked again until ``timeout_s``) instead of failing, and every session
is closed on the loop that opened it, so a check or a run holds one session per live episode.

The reply becomes the action: its text goes into the action's one string field (found in the
action's JSON schema — the server's ``/schema`` or the class's — or named by ``action_field``),
or, with ``action_field="json"``, the reply is parsed as the action's JSON object. An
observation becomes one user message: its one string field besides ``done``/``reward``/
``metadata`` (or ``observation_field``), else its fields as JSON. The env's ``reward`` (None is 0)
and ``done`` are kept; the episode's reward is the sum of its step rewards; agentrl's turn,
token and time limits are added.

What it is not: a container launcher (``from_docker_image``) or the Hub (``AutoEnv``): both need
a registry this adapter does not reach; start the server yourself and name its URL.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import typing
from collections.abc import Mapping
from typing import Any

import gymnasium

from agentrl.api import Message
from agentrl.env import EpisodeLimits, Reward, Rubric, TextEnv, Turn, fact
from agentrl.errors import ConfigError, EnvError
from agentrl.plugins import import_optional, import_user_module

ID_FORM = "openenv:<URL> | openenv:<module>:<Class>"
PREFIX = "openenv:"
EXTRA = "openenv"
EVAL_SEED = 1_000_000_000
SKIP_FIELDS = ("done", "reward", "metadata")


def _package() -> Any:
    return import_optional("openenv", extra=EXTRA, purpose="the openenv:... environments")


def register(env_id: str) -> str:
    """Register ``openenv:<target>`` as ``openenv/<slug>`` and return that id."""
    target = env_id.removeprefix(PREFIX)
    if not target:
        raise ConfigError("an OpenEnv id is 'openenv:http://HOST:PORT' (a server) or 'openenv:module:Class'")
    _package()
    slug = PREFIX.rstrip(":") + "/" + re.sub(r"[^\w.-]+", "_", target).strip("_")
    if slug not in gymnasium.registry:
        gymnasium.register(slug, entry_point=f"{__name__}:OpenEnvEnv", kwargs={"target": target})
    return slug


def listing() -> str:
    try:
        import openenv  # noqa: F401
    except ModuleNotFoundError:
        return f"an OpenEnv server or Environment class; not installed: pip install 'agentrl[{EXTRA}]'"
    from importlib.metadata import version

    return (f"OpenEnv {version('openenv')}: any server (openenv:http://HOST:PORT) or Environment class "
            "(openenv:module:Class); the reply fills the action's string field")


def train_rows(seed: int, n: int = 10_000) -> list[dict[str, Any]]:
    return [{"seed": s} for s in range(n)]


def eval_rows(seed: int, n: int = 200) -> list[dict[str, Any]]:
    return [{"seed": EVAL_SEED + s} for s in range(n)]


class OpenEnvEnv(TextEnv):
    """An OpenEnv environment: a server by URL or a class in this process.

    ## Description
    OpenEnv's ``reset(seed=)`` / ``step(Action)`` -> ``Observation(done, reward, ...)``, the reply
    put into the action's string field, each observation shown as one user message.

    ## Action Space
    ``Text``: the reply (into ``action_field``, or parsed as the action's JSON with "json").

    ## Observation Space
    ``Messages``: one user message per observation (its string field, or its fields as JSON).

    ## Starting State
    ``options["task"]``: ``{"seed": s}`` (passed to the env's ``reset``); else a seed drawn from
    the seeded ``np_random``.

    ## Rewards
    ``reward`` (weight 1): the sum of the observations' rewards (None counts 0), given on the step
    that ends the episode.

    ## Episode End
    Terminated when an observation says ``done``; truncated by ``max_turns``, ``max_tokens``,
    ``max_wall_s``.

    ## Information
    Step: ``step_reward``, ``return``, ``rewards``.

    ## Arguments
    ``target`` (set by the id: a URL or ``module:Class``); ``action_field``; ``observation_field``;
    ``env_args`` (keyword arguments of the class, in-process); ``action_class`` (``module:Name``,
    in-process, when the class's generic parameters do not name it); ``max_turns`` (10);
    ``max_tokens``; ``max_wall_s``; ``timeout_s`` (60, each call to the server); ``render_mode``.

    ## Version History
    * v0: initial version (openenv 0.10).
    """

    def __init__(self, target: str, action_field: str | None = None, observation_field: str | None = None,
                 env_args: Mapping[str, Any] | None = None, action_class: str | None = None, max_turns: int = 10,
                 max_tokens: int | None = None, max_wall_s: float | None = None, timeout_s: float = 60.0,
                 render_mode: str | None = None) -> None:
        super().__init__(rubric=Rubric([Reward("reward", fact("return"))]),
                         limits=EpisodeLimits(max_turns=max_turns, max_tokens=max_tokens, max_wall_s=max_wall_s),
                         render_mode=render_mode)
        _package()
        self.target, self.timeout_s, self.observation_field = target, timeout_s, observation_field
        self.remote = target.startswith(("http://", "https://", "ws://", "wss://"))
        self._client: Any = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._return = 0.0
        if self.remote:
            self.env_cls, self.action_cls, self.inner = None, None, None
            schema = _fetch_schema(target, timeout_s)
        else:
            module, _, name = target.rpartition(":")
            if not module:
                raise ConfigError(f"openenv:{target}: expected 'openenv:module:Class' or 'openenv:http://HOST:PORT'")
            self.env_cls = getattr(import_user_module(module, what=f"openenv:{target}"), name)
            self.action_cls = _load(action_class) if action_class else _action_class_of(self.env_cls, target)
            self.inner = self.env_cls(**dict(env_args or {}))
            schema = self.action_cls.model_json_schema()
        self.action_field = action_field or _string_field(schema, target)

    # ------------------------------------------------------------------ TextEnv hooks

    def sample_task(self) -> dict[str, Any]:
        return {"seed": int(self.np_random.integers(EVAL_SEED))}

    async def _start(self, task: dict[str, Any]) -> list[Message]:
        seed = task.get("seed")
        self._return = 0.0
        if self.remote:
            observation, done = await self._open_session(seed)
        else:
            obs = await asyncio.to_thread(self.inner.reset, seed=seed)
            observation, done = obs.model_dump(), obs.done
        if done:
            raise EnvError(f"openenv:{self.target} said done on reset")
        return self._messages(observation)

    async def _open_session(self, seed: int | None) -> tuple[Any, bool]:
        """A session of the server, reset: one that is full (``CAPACITY_REACHED``: OpenEnv serves one
        session unless an environment declares more) is asked again until ``timeout_s``, so a run
        keeps within what the server allows; then one line says what to change."""
        from openenv.core import GenericEnvClient

        loop = asyncio.get_running_loop()
        deadline, delay = loop.time() + self.timeout_s, 0.05
        while True:
            self._client = GenericEnvClient(base_url=self.target, connect_timeout_s=self.timeout_s,
                                            message_timeout_s=self.timeout_s)
            self._client_loop = loop
            try:
                async with asyncio.timeout(max(deadline - loop.time(), 0.1)):
                    await self._client.connect()
                    result = await self._client.reset(seed=seed)
                return result.observation, result.done
            except RuntimeError as e:  # the client's form of the server's error frame
                if "CAPACITY_REACHED" not in str(e):
                    raise
                await self._end()
                if loop.time() + delay > deadline:
                    raise EnvError(f"the OpenEnv server {self.target} had no free session for {self.timeout_s:g} s "
                                   "(CAPACITY_REACHED): it serves fewer sessions at once than this run opens; "
                                   "serve more (create_app's max_concurrent_envs, with SUPPORTS_CONCURRENT_SESSIONS) "
                                   "or lower rollout.max_concurrent") from None
                await asyncio.sleep(delay)
                delay = min(2 * delay, 1.0)
            except (OSError, TimeoutError) as e:
                await self._end()
                raise EnvError(f"the OpenEnv server {self.target} did not answer: {type(e).__name__}: {e}") from e

    async def _turn(self, action: str) -> Turn:
        payload = self._action(action)
        if payload is None:  # not the JSON the action needs: the model's mistake, shown to it
            return Turn([{"role": "user", "content": "Your reply must be a JSON object of the action's fields."}])
        if self.remote:
            async with asyncio.timeout(self.timeout_s):
                result = await self._client.step(payload)
            observation, reward, done = result.observation, result.reward, result.done
        else:
            try:
                act = self.action_cls(**payload)
            except Exception as e:  # pydantic refused the fields: the model's mistake
                return Turn([{"role": "user", "content": f"Invalid action: {e}"[:500]}])
            obs = await asyncio.to_thread(self.inner.step, act)
            observation, reward, done = obs.model_dump(), obs.reward, obs.done
        step_reward = float(reward or 0.0)
        self._return += step_reward
        if done:  # free the server's session now, not when the env is next reset
            await self._end()
        return Turn([] if done else self._messages(observation), done=bool(done),
                    facts={"step_reward": step_reward, "return": self._return})

    async def _end(self) -> None:
        client, loop, self._client, self._client_loop = self._client, self._client_loop, None, None
        if client is None:
            return
        try:  # on the loop the session was opened on (the sync API's, or this one): its socket lives there
            async with asyncio.timeout(10):
                if loop is asyncio.get_running_loop():
                    await client.close()
                elif loop is not None and loop.is_running():
                    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(client.close(), loop))
                elif loop is not None and not loop.is_closed():  # an idle loop (the sync API's between calls):
                    # left open, the session would hold one of the server's slots until the process ends
                    await asyncio.to_thread(loop.run_until_complete, client.close())
        except Exception:  # closing is best effort; the server ends the session when the socket goes
            pass

    # ------------------------------------------------------------------ translation

    def _action(self, reply: str) -> dict[str, Any] | None:
        if self.action_field != "json":
            return {self.action_field: reply}
        try:
            value = json.loads(reply)
        except json.JSONDecodeError:
            return None
        return value if isinstance(value, dict) else None

    def _messages(self, observation: Mapping[str, Any]) -> list[Message]:
        fields = {k: v for k, v in observation.items() if k not in SKIP_FIELDS}
        if self.observation_field:
            text = fields.get(self.observation_field, "")
        else:
            strings = [k for k, v in fields.items() if isinstance(v, str)]
            text = fields[strings[0]] if len(strings) == 1 and len(fields) == 1 else json.dumps(fields, default=str)
        return [{"role": "user", "content": text if isinstance(text, str) else json.dumps(text, default=str)}]


def _fetch_schema(url: str, timeout_s: float) -> dict[str, Any]:
    import httpx

    base = re.sub(r"^ws", "http", url).rstrip("/")
    try:
        r = httpx.get(base + "/schema", timeout=timeout_s)
        r.raise_for_status()
        return r.json()["action"]
    except (httpx.HTTPError, KeyError, ValueError) as e:
        raise EnvError(f"the OpenEnv server {url} gave no action schema at /schema ({type(e).__name__}: {e}); "
                       "is it an OpenEnv server (create_app), and running?") from e


def _string_field(schema: Mapping[str, Any], target: str) -> str:
    props = {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}
    strings = [k for k, v in props.items() if v.get("type") == "string"]
    if len(props) == 1 and strings:
        return strings[0]
    raise EnvError(f"openenv:{target}: its action has the fields {sorted(props)}, not one string field; pass "
                   "env_kwargs action_field (the field the reply fills) or action_field='json' (the reply is the "
                   "action as a JSON object)")


def _action_class_of(env_cls: type, target: str) -> type:
    for base in getattr(env_cls, "__orig_bases__", ()):
        args = typing.get_args(base)
        if args and isinstance(args[0], type):
            return args[0]
    raise EnvError(f"openenv:{target}: {env_cls.__name__} does not name its Action class as "
                   "Environment[Action, Observation, State]; pass env_kwargs action_class='module:Name'")


def _load(path: str) -> Any:
    module, _, name = path.rpartition(":")
    return getattr(importlib.import_module(module), name)

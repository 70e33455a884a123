"""TextArena's games as agentrl environments: ``textarena/<Game-vN>``, one seat or all of them.

What it is: ``TextArenaEnv``, one TextArena game (``textarena.make``) behind the TextEnv
protocol; ``register`` / ``listing`` for ``agentrl.plugins.find_env`` and ``agentrl envs``;
``train_rows`` / ``eval_rows`` (rows are game seeds: train seeds below ``EVAL_SEED``, eval seeds
from it, so the splits are disjoint). The game keeps its own rules, reward (``env.close()``'s
per-player rewards) and end; the env adds a cap on replies (``max_turns``, all seats together:
some games never end on invalid moves), tokens and wall time, and turns each seat's new
observations (TextArena's ``(sender, message, type)`` triples) into one user message, written
as TextArena's ``LLMObservationWrapper`` writes them (``[GAME] ...``, ``[Player 1] ...``), so a
seat's conversation holds, turn by turn, exactly the text that wrapper would show it. The
game's action wrappers (``[move]`` bracketing) are kept.

Seats. With ``opponents`` unset, every seat is the policy's (self-play): each step's messages
are for the seat whose turn it is, ``info["seat"]`` names it (reset's too), and the step that
ends the game carries ``info["seat_rewards"]``; ``workflows.self_play:SelfPlayWorkflow`` plays
it, one conversation and one trajectory per seat, each with its seat's reward. With
``opponents`` (``{seat: "scripted:TEXT"}`` or ``{seat: {"base_url", "model", "api_key"}}``,
an OpenAI-compatible endpoint), those seats are played inside the env and the policy plays
``seat`` (0) as a one-conversation env that ``workflows.env:EnvWorkflow`` plays.

What it is not: a game server or a tournament; games that need an NLTK corpus, an API key or a
newer Python fail at construction with an ``EnvError`` that says which.
"""

from __future__ import annotations

import asyncio
import random
import re
import threading
from collections.abc import Mapping
from typing import Any

from agentrl.api import Message
from agentrl.env import EpisodeLimits, Reward, Rubric, TextEnv, Turn, fact
from agentrl.errors import EnvError
from agentrl.plugins import import_optional
from envs.interop import register_named

ID_FORM = "textarena/<Game-vN>"
PREFIX = "textarena/"
EXTRA = "textarena"
EVAL_SEED = 1_000_000_000
"""Seeds from here on are the eval split's; train rows and ``sample_task`` draw below it."""
MAX_PLAYERS = 8
_GAME_LOCK = threading.Lock()  # TextArena seeds the global `random` on reset; games draw from it


def _package() -> Any:
    return import_optional("textarena", extra=EXTRA, purpose="the textarena/... environments")


def games(base_only: bool = True) -> list[str]:
    """TextArena's game ids: the base ones (``Name-vN``), or every variant too."""
    from textarena.envs.registration import ENV_REGISTRY

    _package()
    return sorted(i for i in ENV_REGISTRY if not base_only or re.fullmatch(r".+-v\d+", i))


def register(env_id: str) -> str:
    """Register ``textarena/<Game-vN>`` with gymnasium (entry point: ``TextArenaEnv``)."""
    game = env_id.removeprefix(PREFIX)
    _package()
    return register_named(env_id, PREFIX, game, games(base_only=False), "TextArena has no game",
                          f"{__name__}:TextArenaEnv", {"game": game}, "(textarena.envs.registration.ENV_REGISTRY)")


def listing() -> str:
    try:
        import textarena  # noqa: F401
    except ModuleNotFoundError:
        return f"TextArena's games; not installed: pip install 'agentrl[{EXTRA}]'"
    from importlib.metadata import version

    base = games()
    return (f"TextArena {version('textarena')}: {len(base)} games ({', '.join(base[:3])}, ...; "
            f"{len(games(base_only=False))} ids with variants), single- and multi-player (self-play)")


def train_rows(seed: int, n: int = 10_000) -> list[dict[str, Any]]:
    """Rows of the train split (``rollout.dataset``): game seeds 0..n-1."""
    return [{"seed": s} for s in range(n)]


def eval_rows(seed: int, n: int = 200) -> list[dict[str, Any]]:
    """Rows of the eval split (``eval.dataset``): game seeds from ``EVAL_SEED``."""
    return [{"seed": EVAL_SEED + s} for s in range(n)]


def why_it_cannot_run(game: str, error: BaseException) -> str:
    """One line on why a game failed to start here: a corpus, an API key, Python, a package."""
    text = " ".join(f"{type(error).__name__}: {error}".split())
    missing = re.search(r"No module named '([\w.]+)'", text)
    if isinstance(error, LookupError) and ("nltk" in text.lower() or "Resource" in text):
        reason = "needs an NLTK corpus or model that is not installed (nltk.download, which needs the network)"
    elif re.search(r"api[_ ]?key|OPENROUTER|OPENAI_API|authentication", text, re.I):
        reason = "needs an API key of a remote model (a jury or a judge), which it reads from the environment"
    elif isinstance(error, SyntaxError) or "3.12" in text:
        reason = "needs Python >= 3.12 (its code does not parse on this Python)"
    elif missing:
        reason = f"imports the package {missing.group(1)!r}, which TextArena does not declare; install it"
    else:
        reason = "failed to start"
    return f"TextArena game {game!r} {reason} ({text[:300]})"


class TextArenaEnv(TextEnv):
    """One TextArena game; self-play over every seat, or one seat against fixed opponents.

    ## Description
    A TextArena game (``textarena.make(game)``), its rules and rewards unchanged. Each turn the
    acting seat sees its new observations as one user message and replies with its move.

    ## Action Space
    ``Text``: the acting seat's reply (TextArena's action wrappers bracket it as the game expects).

    ## Observation Space
    ``Messages``: one user message of the acting seat's new observations (``[GAME] ...`` lines),
    or ``[]`` when it has none. Self-play: ``info["seat"]`` names the seat the messages are for.

    ## Starting State
    ``options["task"]``: ``{"seed": s}`` (the game's seed); else a train seed drawn from the
    seeded ``np_random``.

    ## Rewards
    ``reward`` (weight 1): the game's reward for the policy's seat (``env.close()``), given on the
    step that ends the game; 0 for every seat when agentrl's cap ends it first. Self-play: the
    step's reward is the last mover's; ``info["seat_rewards"]`` holds every seat's.

    ## Episode End
    Terminated when the game ends; truncated by ``max_turns`` (replies of all seats), ``max_tokens``
    or ``max_wall_s``.

    ## Information
    Step: ``seat`` (who acts next), ``seat_rewards`` and ``game_info`` at the end, ``rewards``.

    ## Arguments
    ``game`` (set by the id); ``num_players`` (None: the fewest the game accepts); ``opponents``
    (None: self-play; else ``{seat: "scripted:TEXT" | {"base_url", "model", "api_key"}}``);
    ``seat`` (0): the policy's seat against opponents; ``game_kwargs``: the game's own arguments;
    ``max_turns`` (50); ``max_tokens``; ``max_wall_s``; ``opponent_timeout_s`` (60); ``render_mode``.

    ## Version History
    * v0: initial version (textarena 0.7.4).
    """

    def __init__(self, game: str, num_players: int | None = None, opponents: Mapping[Any, Any] | None = None,
                 seat: int = 0, game_kwargs: Mapping[str, Any] | None = None, max_turns: int = 50,
                 max_tokens: int | None = None, max_wall_s: float | None = None, opponent_timeout_s: float = 60.0,
                 render_mode: str | None = None) -> None:
        super().__init__(rubric=Rubric([Reward("reward", fact("reward"))]),
                         limits=EpisodeLimits(max_turns=max_turns, max_tokens=max_tokens, max_wall_s=max_wall_s),
                         render_mode=render_mode)
        ta = _package()
        self.game_id = game
        try:
            made = ta.make(env_id=game, **dict(game_kwargs or {}))
        except Exception as e:
            raise EnvError(why_it_cannot_run(game, e)) from e
        self.game = _keep_action_wrappers(ta, made)
        self.num_players = num_players or self._fewest_players()
        self.opponents = {int(s): _opponent(spec, opponent_timeout_s) for s, spec in (opponents or {}).items()}
        self.self_play = not self.opponents and self.num_players > 1
        self.seat = seat
        bad = sorted(s for s in [*self.opponents, seat] if not 0 <= s < self.num_players)
        if bad or (not self.self_play and seat in self.opponents):
            raise EnvError(f"seats {bad or [seat]} of {game} ({self.num_players} players): opponents take seats "
                           f"other than the policy's seat {seat}, each in 0..{self.num_players - 1}")
        if not self.self_play and len(self.opponents) != self.num_players - 1:
            raise EnvError(f"{game} has {self.num_players} players: give an opponent for every seat but {seat}")
        self._acting = 0
        self._histories: dict[int, list[Message]] = {}

    # ------------------------------------------------------------------ the game's calls, under the lock

    def _fewest_players(self) -> int:
        first_error: BaseException | None = None
        for n in range(1, MAX_PLAYERS + 1):
            try:
                with _GAME_LOCK:
                    self.game.reset(num_players=n, seed=0)
                return n
            except Exception as e:
                if isinstance(e, AssertionError) or "player" in str(e).lower():
                    continue  # the count is refused
                first_error = first_error or e
                break
        if first_error is not None:
            raise EnvError(why_it_cannot_run(self.game_id, first_error)) from first_error
        raise EnvError(f"TextArena game {self.game_id!r} accepts no number of players in 1..{MAX_PLAYERS}")

    def _reset_game(self, seed: int) -> tuple[int, list]:
        with _GAME_LOCK:
            try:
                random.seed(seed)  # as verifiers' TextArena taskset does: some games draw before seeding
                self.game.reset(num_players=self.num_players, seed=seed)
            except Exception as e:
                raise EnvError(why_it_cannot_run(self.game_id, e)) from e
            return self.game.get_observation()

    def _step_game(self, action: str) -> tuple[bool, int, list]:
        with _GAME_LOCK:
            done, _ = self.game.step(action=action)
            if done:
                return True, -1, []
            pid, obs = self.game.get_observation()
            return False, pid, obs

    def _close_game(self) -> tuple[dict[int, float], Any]:
        with _GAME_LOCK:
            rewards, game_info = self.game.close()
        try:
            seat_rewards = {int(p): float(r) for p, r in (rewards or {}).items()}
        except (TypeError, ValueError) as e:
            raise EnvError(f"TextArena game {self.game_id!r} ended with rewards {rewards!r:.300}, not numbers "
                           "per player") from e
        return seat_rewards, _jsonable(game_info)

    # ------------------------------------------------------------------ TextEnv hooks

    def sample_task(self) -> dict[str, Any]:
        return {"seed": int(self.np_random.integers(EVAL_SEED))}

    async def _start(self, task: dict[str, Any]) -> list[Message]:
        seed = task.get("seed")
        if not isinstance(seed, int):
            raise EnvError(f"a {PREFIX}{self.game_id} row is {{'seed': int}}, got {task}")
        pid, obs = await asyncio.to_thread(self._reset_game, seed)
        self._histories = {}
        if not self.self_play:
            done, pid, obs = await self._opponents_play(pid, obs)
            if done:
                raise EnvError(f"{self.game_id} ended before the policy's seat {self.seat} moved")
        self._acting = pid
        self.start_facts = {"seat": pid} if self.self_play else {}
        return self._render(obs)

    async def _turn(self, action: str) -> Turn:
        done, pid, obs = await asyncio.to_thread(self._step_game, action)
        if not done and not self.self_play:
            done, pid, obs = await self._opponents_play(pid, obs)
        if done:
            seat_rewards, game_info = await asyncio.to_thread(self._close_game)
            reward = seat_rewards.get(self._acting if self.self_play else self.seat, 0.0)
            return Turn([], done=True, facts={"reward": reward, "seat_rewards": seat_rewards,
                                              "game_info": game_info})
        self._acting = pid
        return Turn(self._render(obs), done=False, facts={"seat": pid} if self.self_play else {})

    async def _opponents_play(self, pid: int, obs: list) -> tuple[bool, int, list]:
        """Let the fixed opponents move until it is the policy's seat's turn or the game ends."""
        while pid != self.seat:
            history = self._histories.setdefault(pid, [])
            history.extend(self._render(obs))
            move = await self.opponents[pid](history)
            history.append({"role": "assistant", "content": move})
            done, pid, obs = await asyncio.to_thread(self._step_game, move)
            if done:
                return True, -1, []
        return False, pid, obs

    def _render(self, obs: list) -> list[Message]:
        if not obs:
            return []
        roles = getattr(getattr(self.game, "state", None), "role_mapping", {}) or {}
        lines = [f"[{'GAME' if sender == -1 else roles.get(sender, f'Player {sender}')}] {message}"
                 for sender, message, *_ in obs]
        return [{"role": "user", "content": "\n".join(lines)}]


def _keep_action_wrappers(ta: Any, env: Any) -> Any:
    """The raw game under ``env``'s wrappers, with only its action wrappers put back (we render
    observations ourselves, one turn's new ones at a time)."""
    actions = []
    while isinstance(env, ta.Wrapper):
        if isinstance(env, ta.ActionWrapper):
            actions.append(type(env))
        env = env.env
    for wrapper in reversed(actions):
        env = wrapper(env)
    return env


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def _opponent(spec: Any, timeout_s: float) -> Any:
    """A fixed opponent: ``"scripted:TEXT"`` (always TEXT) or an OpenAI-compatible endpoint."""
    if isinstance(spec, str) and spec.startswith("scripted:"):
        text = spec.removeprefix("scripted:")

        async def scripted(history: list[Message]) -> str:
            return text

        return scripted
    if isinstance(spec, Mapping) and {"base_url", "model"} <= set(spec):
        import httpx

        url = str(spec["base_url"]).rstrip("/") + "/chat/completions"
        headers = {"Authorization": f"Bearer {spec.get('api_key') or 'none'}"}
        extra = dict(spec.get("sampling") or {"max_tokens": 64})

        async def endpoint(history: list[Message]) -> str:
            async with httpx.AsyncClient(timeout=timeout_s) as client:
                r = await client.post(url, headers=headers, json={"model": spec["model"], "messages": history, **extra})
            if r.status_code != 200:
                raise EnvError(f"the opponent at {url} answered {r.status_code}: {r.text[:200]}")
            return r.json()["choices"][0]["message"]["content"] or ""

        return endpoint
    raise EnvError(f"an opponent is 'scripted:TEXT' or {{'base_url', 'model', 'api_key'}}, got {spec!r}")

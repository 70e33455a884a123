"""What ``agentrl envs check`` runs: Gymnasium's ``check_env`` plus agentrl's own checks.

``check_text_env(env_id)`` returns the problems found (an empty list means the env passes):
Gymnasium's ``check_env`` with its warnings turned into failures, then (for the envs shipped in
``envs/`` only) the Gymnasium docstring sections, seeded determinism of reset, varied tasks across seeds, a step with an
empty reply (finite reward, every reward term in ``info`` when the episode ends),
``areset``/``astep`` agreeing with ``reset``/``step``, and a clean double close. A user's env
is not held to our docstring style: ``docstring_advice`` says which sections it lacks, and
``agentrl envs check`` prints that as advice, not as a failure.
Environments are found only through ``agentrl.plugins.find_env`` (the core never imports
``envs`` by name): ``agentrl/...`` ids, and ``"module:ns/Name-vN"`` for a module of the user's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentrl.env.text_env import TextEnv

DOC_SECTIONS = ("Description", "Action Space", "Observation Space", "Starting State", "Rewards",
                "Episode End", "Information", "Arguments", "Version History")


def registered_ids(modules: tuple[str, ...] = ()) -> list[str]:
    """Every id registered outside Gymnasium's own, after the environment packages and
    ``modules`` (the user's, imported as ``agentrl.plugins.import_user_module`` does) ran."""
    import gymnasium

    from agentrl.plugins import import_user_module, register_envs

    register_envs()
    for name in modules:
        import_user_module(name, what=f"--import {name}")
    return sorted(i for i, spec in gymnasium.registry.items()
                  if not _gymnasiums_own(spec) and not _an_ecosystems(spec))


def ecosystem_lines() -> list[tuple[str, str]]:
    """One ``(id form, what is installed)`` pair per ecosystem of ``agentrl.plugins.ECOSYSTEMS``
    (reasoning-gym, TextArena, ...): its tasks when its package is installed, else the extra."""
    from agentrl.plugins import ECOSYSTEMS, load_object

    lines = []
    for module in ECOSYSTEMS.values():
        form = load_object(f"{module}:ID_FORM")
        try:
            lines.append((form, load_object(f"{module}:listing")()))
        except Exception as e:  # an installed package that fails to import here
            lines.append((form, f"(cannot list: {type(e).__name__}: {e})"))
    return lines


def _gymnasiums_own(spec) -> bool:
    """Whether Gymnasium itself registered the id (its entry points live in its own package)."""
    return _entry_module(spec).startswith("gymnasium.")


def _an_ecosystems(spec) -> bool:
    """Whether an ecosystem adapter registered the id on first use (listed by ``ecosystem_lines``)."""
    from agentrl.plugins import ECOSYSTEMS

    return _entry_module(spec).startswith(tuple(ECOSYSTEMS.values()))


def _entry_module(spec) -> str:
    entry = spec.entry_point
    return entry if isinstance(entry, str) else getattr(entry, "__module__", "") or ""


def env_class(env_id: str) -> type:
    import gymnasium
    from gymnasium.envs.registration import load_env_creator

    entry = gymnasium.registry[env_id].entry_point
    return load_env_creator(entry) if isinstance(entry, str) else entry


def summary(env_id: str) -> str:
    """The first line of the env class's docstring (or why its class cannot be loaded)."""
    try:
        doc = (env_class(env_id).__doc__ or "").strip()
    except Exception as e:  # another package's env whose entry point does not import here
        return f"(cannot load its class: {type(e).__name__}: {e})"
    return doc.splitlines()[0] if doc else "(no docstring)"


def shipped(env_id: str) -> bool:
    """Whether the env is one of those shipped in ``envs/`` (its entry point lives in that package)."""
    import gymnasium

    from agentrl.plugins import find_env

    return _entry_module(gymnasium.registry[find_env(env_id)]).startswith("envs.")


def docstring_advice(env_id: str) -> list[str]:
    """The Gymnasium docstring sections (``DOC_SECTIONS``) the env class's docstring lacks, as one
    line of advice (empty when it has them all): they are how ``agentrl envs`` and a reader learn
    the env, but a user's env runs and trains without them."""
    from agentrl.plugins import find_env

    doc = env_class(find_env(env_id)).__doc__ or ""
    missing = [s for s in DOC_SECTIONS if f"## {s}" not in doc]
    return [f"docstring lacks the Gymnasium sections {missing}"] if missing else []


def check_text_env(env_id: str, kwargs: dict | None = None, seeds: tuple[int, ...] = (0, 1, 2, 3, 4), *,
                   docstring_sections: bool | None = None) -> list[str]:
    """Gymnasium's ``check_env`` (warnings are failures) plus agentrl's checks; the problems found.

    Args:
        env_id: a registered id, or ``module:ns/Name-vN``.
        kwargs: keyword arguments for ``gymnasium.make``.
        seeds: the seeds reset is checked with (determinism, varied tasks).
        docstring_sections: whether a missing Gymnasium docstring section is a problem; by default
            only for the envs shipped in ``envs/`` (for others, see ``docstring_advice``).
    """
    import asyncio
    import math
    import warnings

    import gymnasium
    from gymnasium.utils.env_checker import check_env

    from agentrl.env.text_env import Messages, Text, TextEnv
    from agentrl.plugins import find_env

    env_id = find_env(env_id)
    kwargs = dict(kwargs or {})
    strict = shipped(env_id) if docstring_sections is None else docstring_sections
    problems: list[str] = docstring_advice(env_id) if strict else []
    try:
        env = gymnasium.make(env_id, **kwargs)
    except (TypeError, ValueError) as e:
        from agentrl.errors import ConfigError

        raise ConfigError(f"cannot make {env_id} with {kwargs}: {e}") from e
    try:
        raw = env.unwrapped
        if not isinstance(raw, TextEnv):
            problems.append(f"{type(raw).__name__} is not an agentrl.env.TextEnv")
            return problems
        if not isinstance(raw.observation_space, Messages) or not isinstance(raw.action_space, Text):
            problems.append("observation/action spaces must be agentrl.env.Messages / Text")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                check_env(raw, skip_close_check=True, skip_render_check=True)
                raw._sync(raw._end())  # the episode's session (a server's) freed before another env opens one
                _check_render_modes(raw)
            except Exception as e:
                problems.append(f"gymnasium check_env: {type(e).__name__}: {e}")
        first = [env.reset(seed=s)[0] for s in seeds]
        again = [env.reset(seed=s)[0] for s in seeds]
        if first != again:
            problems.append("reset(seed=s) gave different observations for the same seed; draw the task "
                            "from self.np_random, which reset(seed=...) seeds")
        if len({repr(o) for o in first}) < 2 and len({_task_of(env, s) for s in seeds}) < 2:
            problems.append(
                f"reset(seed=s) for the seeds {seeds} gave the same opening messages, and the same "
                "reply ('42') got the same answer from the env under every seed: the seed does not "
                "seem to choose the task (a hidden task passes once the env answers differently or "
                "its task attribute differs). Draw the task in sample_task() from self.np_random")
        env.reset(seed=seeds[0])
        obs, reward, terminated, truncated, info = env.step("")
        if not (isinstance(reward, float) and math.isfinite(reward)):
            problems.append(f"step('') gave reward {reward!r}; expected a finite float")
        if (terminated or truncated) and "rewards" not in info:
            problems.append("the last step's info lacks 'rewards' (each reward term by name)")

        async def async_path():
            o, _ = await raw.areset(seed=seeds[0])
            return o, await raw.astep("")

        async_obs, async_step = asyncio.run(async_path())
        if async_obs != first[0]:
            problems.append("areset(seed) and reset(seed) disagree")
        if async_step != (obs, reward, terminated, truncated, info):
            problems.append("astep and step disagree on the same seed and reply")
    finally:
        env.close()
        try:
            env.close()
        except Exception as e:
            problems.append(f"a second close() raised {type(e).__name__}: {e}")
    return problems


def _check_render_modes(env: TextEnv) -> None:
    """Gymnasium's render check: each declared render mode made and rendered, one env at a time
    (``check_env`` makes them while ``env`` still holds its episode: a server of one session
    refused them)."""
    from gymnasium.utils.passive_env_checker import env_render_passive_checker

    if env.render_mode is not None:
        env_render_passive_checker(env)
    for mode in env.metadata.get("render_modes", []) if env.spec is not None else []:
        other = env.spec.make(render_mode=mode)
        try:
            other.reset()
            env_render_passive_checker(other)
        finally:
            other.close()


def _task_of(env, seed: int) -> str:
    """What tells the tasks of two seeds apart when the opening messages are equal (a hidden
    number, say): the env's ``task`` attribute where it has one (``TextEnv`` keeps it), and how
    the env answers one fixed reply."""
    env.reset(seed=seed)
    task = getattr(env.unwrapped, "task", None)
    answer = env.step("42")
    return repr((task, answer[0], answer[1]))

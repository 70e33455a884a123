"""What ``agentrl envs check`` runs: Gymnasium's ``check_env`` plus agentrl's own checks.

``check_text_env(env_id)`` returns the problems found (an empty list means the env passes):
Gymnasium's ``check_env`` with its warnings turned into failures, then the Gymnasium
docstring sections, seeded determinism of reset, varied tasks across seeds, a step with an
empty reply (finite reward, every reward term in ``info`` when the episode ends),
``areset``/``astep`` agreeing with ``reset``/``step``, and a clean double close.
Environments are found only through ``agentrl.plugins.register_envs()`` (the core never
imports ``envs`` by name).
"""

from __future__ import annotations

DOC_SECTIONS = ("Description", "Action Space", "Observation Space", "Starting State", "Rewards",
                "Episode End", "Information", "Arguments", "Version History")


def registered_ids() -> list[str]:
    """Every ``agentrl/...`` id, after the environment packages registered theirs."""
    import gymnasium

    from agentrl.plugins import register_envs

    register_envs()
    return sorted(i for i in gymnasium.registry if i.startswith("agentrl/"))


def env_class(env_id: str) -> type:
    import gymnasium
    from gymnasium.envs.registration import load_env_creator

    entry = gymnasium.registry[env_id].entry_point
    return load_env_creator(entry) if isinstance(entry, str) else entry


def summary(env_id: str) -> str:
    """The first line of the env class's docstring."""
    doc = (env_class(env_id).__doc__ or "").strip()
    return doc.splitlines()[0] if doc else "(no docstring)"


def check_text_env(env_id: str, kwargs: dict | None = None, seeds: tuple[int, ...] = (0, 1, 2, 3, 4)) -> list[str]:
    """Gymnasium's ``check_env`` (warnings are failures) plus agentrl's checks; the problems found."""
    import asyncio
    import math
    import warnings

    import gymnasium
    from gymnasium.utils.env_checker import check_env

    from agentrl.env.text_env import Messages, Text, TextEnv

    kwargs = dict(kwargs or {})
    problems: list[str] = []
    doc = env_class(env_id).__doc__ or ""
    missing = [s for s in DOC_SECTIONS if f"## {s}" not in doc]
    if missing:
        problems.append(f"docstring lacks the Gymnasium sections {missing}")
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
                check_env(raw, skip_close_check=True)
            except Exception as e:
                problems.append(f"gymnasium check_env: {type(e).__name__}: {e}")
        first = [env.reset(seed=s)[0] for s in seeds]
        again = [env.reset(seed=s)[0] for s in seeds]
        if first != again:
            problems.append("reset(seed=s) gave different observations for the same seed")
        if len({repr(o) for o in first}) < 2:
            problems.append(f"reset gave the same task for all seeds {seeds}")
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

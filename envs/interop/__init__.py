"""Other ecosystems' environments, unchanged, behind agentrl's env protocol: one adapter each.

    reasoning_gym_env.py  ``reasoning_gym/<task>``        reasoning-gym's procedural tasks
    textarena_env.py      ``textarena/<Game-vN>``         TextArena's games (self-play or fixed opponents)
    skyrl_gym_env.py      ``skyrl_gym/<id>``              SkyRL-Gym's envs, rows from ``rollout.dataset``
    openenv_env.py        ``openenv:<URL>`` / ``openenv:<module>:<Class>``   an OpenEnv server or class
    verifiers_env.py      ``verifiers:<taskset>``         a verifiers taskset (its harness, our gateway)

Each adapter keeps the ecosystem's own reward and episode end and adds agentrl's turn, token
and time limits (``agentrl.env.EpisodeLimits``) and failure typing. Ids are resolved by
``agentrl.plugins.find_env`` (its ``ECOSYSTEMS`` table): the adapter registers an id with
gymnasium the first time it is named, so nothing here is imported until then. A missing
package is one ``ConfigError`` naming the extra to install (``pip install 'agentrl[textarena]'``).
"""

from __future__ import annotations

import difflib
from typing import Any


def register_named(env_id: str, prefix: str, name: str, names: list[str], what: str, entry_point: str,
                   kwargs: dict[str, Any], where: str) -> str:
    """Register ``env_id`` (``prefix + name``) with gymnasium once, after checking ``name`` is
    one of the ecosystem's ``names`` (else a ``ConfigError`` with a "did you mean", naming
    ``what`` it is and ``where`` the list comes from)."""
    import gymnasium

    from agentrl.errors import ConfigError

    if name not in names:
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean {prefix + close[0]!r}? " if close else ""
        raise ConfigError(f"{what} {name!r}; {hint}{where}")
    if env_id not in gymnasium.registry:
        gymnasium.register(env_id, entry_point=entry_point, kwargs=kwargs)
    return env_id

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

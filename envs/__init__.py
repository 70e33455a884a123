"""Gymnasium environments shipped with agentrl, registered as ``agentrl/Name-vN`` on import.

One module (or package) per task family: ``arith`` (and ``arith_retry``), ``math``, ``code``,
``tool_use``, ``repo``.
Entry points are import-path strings, so importing this package is cheap: an env's
module is imported only when ``gymnasium.make`` builds it. Bump the version of an id when
its observations or rewards change.
"""

import gymnasium

ENVS = {
    "agentrl/Arith-v0": "envs.arith:ArithEnv",
    "agentrl/ArithRetry-v0": "envs.arith_retry:ArithRetryEnv",
    "agentrl/Math-v1": "envs.math.env:MathEnv",
    "agentrl/MathRetry-v1": "envs.math.env:MathRetryEnv",
    "agentrl/Code-v0": "envs.code.env:CodeEnv",
    "agentrl/CodeAgent-v0": "envs.code.agent:CodeAgentEnv",
    "agentrl/ToolUse-v0": "envs.tool_use:ToolUseEnv",
    "agentrl/Repo-v0": "envs.repo.env:RepoEnv",
}
"""Every id this package registers and its entry point."""

for _env_id, _entry_point in ENVS.items():
    if _env_id not in gymnasium.registry:
        gymnasium.register(_env_id, entry_point=_entry_point)

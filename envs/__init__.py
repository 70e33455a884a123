"""Gymnasium environments shipped with agentrl, registered as ``agentrl/Name-vN`` on import.

    arith.py        Arith-v0: integer arithmetic from a seed, the tiny demo model's task
    arith_retry.py  ArithRetry-v0: arithmetic with feedback and retries (multi-turn)
    tool_use.py     ToolUse-v0: a calculator, a price lookup, programs run in a sandbox
    math/           Math-v1 and its retry form, graded by the math verifier
    code/           Code and CodeAgent: programs graded by tests run in a sandbox
    repo/           Repo-v0: repository tasks (SWE-bench rows, Harbor dirs) in Docker, graded by their tests
    interop/        other ecosystems' environments behind our env protocol, one adapter each

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

"""What an environment author uses: the TextEnv base class, rewards, tools and datasets.

    text_env.py  TextEnv (two coroutine hooks; limits, async API, tools and reward report
                 built in), its spaces ``Messages`` and ``Text``, ``EpisodeLimits``, ``Turn``
    rewards.py   Rubric: the reward as named, weighted terms (``Reward``, ``fact``, ...)
    judge.py     LLMJudge: a reward term graded by an OpenAI-compatible model and a rubric prompt
    tools.py     ToolBox and ``@tool``: typed functions as OpenAI tools the model can call
    datasets.py  the data files shipped with agentrl (``data_path``, ``load_rows``), a run's
                 dataset specs (``dataset_rows``: a file or ``module:function``)
    sandbox_config.py  SandboxConfig: the sandbox code envs get (a run's ``sandbox`` section)
    mcp_tools.py MCPTools: an MCP server's tools (stdio or streamable HTTP) as a ToolBox's tool source
    checks.py    what ``agentrl envs check`` runs: Gymnasium's check_env plus our own checks

The environments themselves live in the ``envs`` package (registered as ``agentrl/Name-vN``).
"""

from agentrl.env.datasets import data_path, load_rows
from agentrl.env.rewards import Reward, RewardInput, Rubric, fact
from agentrl.env.text_env import EpisodeLimits, Messages, Text, TextEnv, Turn
from agentrl.env.tools import ToolBox, tool

__all__ = ["EpisodeLimits", "Messages", "Reward", "RewardInput", "Rubric", "Text", "TextEnv", "ToolBox", "Turn",
           "data_path", "fact", "load_rows", "tool"]

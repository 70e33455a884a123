"""The rollout side: how episodes turn into exact token streams, in-process and over HTTP.

    renderer.py      ChatRenderer: chat template -> text -> token ids and back, exactly
    conversation.py  TokenConversation: one episode's calls and segments, token-in token-out
    env_pool.py      EnvPool: environments built once, leased per episode
    episode.py       what every workflow shares: failures as data, sampling settings, metrics

Workflows (``workflows/``) are built on these. This package sits between the CLI and the
components (inference, env, model, trainer): it may import them, they never import it.
"""

from agentrl.rollout.conversation import TokenConversation
from agentrl.rollout.env_pool import EnvPool
from agentrl.rollout.renderer import ChatRenderer, load_tokenizer

__all__ = ["ChatRenderer", "EnvPool", "TokenConversation", "load_tokenizer"]

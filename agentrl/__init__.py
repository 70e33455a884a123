"""agentrl: asynchronous reinforcement learning for multi-turn LLM agents.

The public contracts live in ``agentrl.api``; errors in ``agentrl.errors``.
"""

__version__ = "0.1.0"

"""Agent workflows: how an episode is played against an inference client.

    single_turn.py            one prompt, one reply
    env.py                    EnvWorkflow: any registered multi-turn env, token-in token-out
    tool_agent.py             ToolAgentWorkflow: an OpenAI chat-completions agent running the env's tools
    external_agent.py         ExternalAgentWorkflow: another program through a gateway session
    verifiers_harness.py      a verifiers taskset played by its own harness (verifiers_agent.py, its venv)
    mini_swe_agent.py         mini-swe-agent on agentrl/Repo-v0 (mini_swe_agent_runner.py, its venv)
    self_play.py              SelfPlayWorkflow: every seat of a game, one conversation each
"""

"""Agent workflows: how an episode is played against an inference client.

    single_turn.py        SingleTurnWorkflow: prompt -> one completion -> the environment's reward
    env.py                EnvWorkflow: any registered multi-turn environment, token-in token-out
    tool_agent.py         ToolAgentWorkflow: an agent loop written against the OpenAI chat interface
    external_agent.py     ExternalAgentWorkflow: an episode played by another program through the gateway
    self_play.py          SelfPlayWorkflow: the policy plays every seat of a game, one trajectory each
    verifiers_harness.py  VerifiersWorkflow: a verifiers taskset played by its own harness
    verifiers_agent.py    the agent program verifiers_harness runs in verifiers' own environment
    mini_swe_agent.py     MiniSweAgentWorkflow: mini-swe-agent, unchanged, on agentrl/Repo-v0 through the gateway
    mini_swe_agent_runner.py  the program mini_swe_agent.py runs in mini-swe-agent's own venv
"""

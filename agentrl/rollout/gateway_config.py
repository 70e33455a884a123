"""``GatewayConfig``: every setting of the OpenAI-compatible gateway, declared once.

What it is: the one dataclass three users share — ``Gateway`` (``agentrl.rollout.gateway``)
and its HTTP app (``agentrl.rollout.gateway_routes``) read it, ``agentrl gateway`` generates
its flags from it (``agentrl.config.add_arguments``), and a training run's ``gateway``
section is one (``agentrl.run.run_config``, which serves on a free port by default).
What it is not: the wiring a caller supplies — the engine or ``--upstream`` servers, the
tokenizer (``--model``), the output folder, the episode hook — nor the admin key itself,
which never goes into a saved config: only the name of the variable that holds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.config import option
from agentrl.inference.serve_config import reasoning_parser_option, tool_call_parser_option


@dataclass
class GatewayConfig:
    """Settings of one gateway (``agentrl gateway --field-name``, a run's ``gateway.field_name``)."""

    host: str = option("127.0.0.1", help="address to listen on (not loopback: an API key is required)")
    port: int = option(30100, ge=0, le=65535, help="port; 0 picks a free one (a run writes RUN_DIR/gateway.json "
                                                   "saying which)")
    api_key_env: str = option("AGENTRL_GATEWAY_API_KEY", help="environment variable holding the admin key that "
                                                               "opens sessions and reads stats (unset: no key)")
    session_timeout_s: float = option(600.0, gt=0, flag="--session-timeout",
                                      help="idle seconds before a session is ended as failed data")
    max_sessions: int = option(4096, ge=1, help="sessions open at once; more are refused")
    max_session_tokens: int | None = option(65536, ge=1, help="tokens one session may hold (prompts and "
                                                              "completions); none: no limit")
    default_max_tokens: int | None = option(1024, ge=1, help="completion budget of a call that gives none (in a "
                                                             "run, null: rollout.sampling.max_new_tokens)")
    context_length: int | None = option(None, ge=1, help="prompt + completion limit; none: agentrl gateway "
                                                         "asks the upstreams (their max_model_len), else no limit")
    served_model_name: str | None = option(None, help="model id in /v1/models and in answers; none: the "
                                                      "tokenizer's directory (--model, a run's model)")
    max_body_bytes: int = option(4 << 20, ge=1, help="largest request body in bytes (413 above)")
    keep_ended: int = option(10_000, ge=0, help="summaries of ended sessions kept for GET /v1/sessions/ID")
    discount: float = option(
        1.0, ge=0, le=1, help="γ of the returns over a session's calls when /end names none: with 1 every call, and "
        "so every segment of an agent that rewrote its history, carries the episode's reward")
    agent_sampling: str = option(
        "policy", choices=("policy", "agent"),
        help="policy: every call samples the policy's own distribution (temperature 1, no top-p/top-k/min-p, no "
        "penalties or logit bias, whatever the agent asks), so the recorded log-probabilities are those the trainer "
        "recomputes; agent: the agent's settings go to the engine (data for SFT or evaluation, not for a run)")
    tool_call_parser: str = tool_call_parser_option("read into message.tool_calls")
    reasoning_parser: str | None = reasoning_parser_option("read into message.reasoning_content, and a tool call "
                                                           "written in it is never returned")

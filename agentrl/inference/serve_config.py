"""``ServeConfig``: every setting of one ``agentrl serve`` process, declared once.

What it is: the dataclass the ``agentrl serve`` flags are generated from
(``agentrl.config.add_arguments``) and that embedding code builds directly
(``build_app(ServeConfig(model=...))``); each field's help, default and bounds live here.
What it is not: the server's state (``agentrl.inference.state``) or the command's wiring
(``agentrl.cli.serve_command``: ``--log-level``, the key from ``$AGENTRL_SERVE_API_KEY``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl.config import option
from agentrl.http_edge import SERVER_KEY_ENV
from agentrl.toolcalls import DEFAULT_TOOL_PARSER, REASONING_PARSERS, TOOL_PARSERS


def tool_call_parser_option(what: str) -> Any:
    """The one declaration of a ``tool_call_parser`` setting (serve, the gateway, a run's rollouts)."""
    return option(DEFAULT_TOOL_PARSER, choices=sorted(TOOL_PARSERS),
                  help=f"format of the model's tool calls, by SGLang's name (agentrl.toolcalls): {what}")


def reasoning_parser_option(what: str) -> Any:
    """The one declaration of a ``reasoning_parser`` setting (serve, the gateway, a run's rollouts)."""
    return option(None, choices=sorted(REASONING_PARSERS),
                  help=f"format of the model's reasoning, by SGLang's name (default: none): {what}")


DEFAULT_CONTEXT_LENGTH = 4096
"""The context of a server not given ``--context-length``: the model's, up to this many tokens."""
DEFAULT_PREFIX_CACHE_TOKENS = 32768
"""The prefix cache of a server not given ``--prefix-cache-tokens``: every slot's context, up to this."""
API_KEY_ENV = SERVER_KEY_ENV
"""Where ``agentrl serve`` finds the API key when ``--api-key`` is not given (out of process listings)."""


@dataclass
class ServeConfig:
    """Settings of one ``agentrl serve`` process (its flags: ``--field-name``)."""

    model: str = option(help="Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer)")
    host: str = option("127.0.0.1", help="address to listen on")
    port: int = option(30000, help="port to listen on; 0 picks a free one (30000 is SGLang's)", ge=0, le=65535)
    device: str = option("cpu", help="where the model runs", choices=("cpu", "cuda"))
    max_running_requests: int = option(64, help="KV-cache slots: requests decoded together", ge=1)
    context_length: int | None = option(
        None, help=f"longest prompt + output in tokens; default min(model's max positions, {DEFAULT_CONTEXT_LENGTH})",
        ge=2)
    threads: int | None = option(None, help="torch CPU threads (default: torch's choice)", ge=1)
    weight_version: str = option("default", help="initial weight version (SGLang's --weight-version)")
    served_model_name: str | None = option(None, help="model id in /v1/models (default: the model path)")
    seed: int = option(0, help="seed of the engine's RNG for requests without a sampling_seed")
    enable_deterministic_inference: bool = option(
        False, help="batch-invariant decoding (SGLang's flag): a request's tokens and logprobs do not depend on what "
        "shares its batch or on the prefix cache; with a sampling_seed, the same request gives the same bits "
        "every time (costs speed: agentrl.inference.decoder INVARIANT_ROWS)")
    prepack_weights: bool = option(
        True, help="multiply by copies of the projections' weights in oneDNN's blocked layout, remade with every "
        "weight update (float32 on a CPU, not with --enable-deterministic-inference; elsewhere off): faster "
        "decoding on a CPU (benchmarks/RESULTS.md) for a second copy of the projections in memory")
    disable_radix_cache: bool = option(False, help="no prefix cache: every prompt is computed in full "
                                       "(SGLang's --disable-radix-cache)")
    prefix_cache_tokens: int | None = option(
        None, help="tokens of KV the prefix cache keeps before evicting the least recently used; "
        f"default min(max_running_requests x context_length, {DEFAULT_PREFIX_CACHE_TOKENS})", ge=1)
    api_key: str | None = option(None, help="every route but /health* and /ready needs 'Authorization: Bearer "
                                 f"KEY' (SGLang's --api-key); agentrl serve reads ${API_KEY_ENV} when not "
                                 "given; none: no key")
    max_n: int = option(256, help="most samples one request may ask for (sampling_params.n, OpenAI n)", ge=1)
    max_top_logprobs_num: int = option(64, help="most alternatives per position (top_logprobs_num)", ge=0)
    max_queued_requests: int = option(
        4096, help="most requests waiting or running at once; more are refused with 503 (SGLang's "
        "--max-queued-requests)", ge=1)
    max_request_bytes: int = option(64 << 20, help="largest request body in bytes (413 above)", ge=1024)
    trust_request_chat_template: bool = option(
        False, help="accept a chat template sent in a request (chat_template_kwargs.chat_template), rendered in a "
        "child process bounded in time and memory (vLLM's flag); off: such requests get a 400")
    tool_call_parser: str = tool_call_parser_option("read into message.tool_calls")
    reasoning_parser: str | None = reasoning_parser_option("read into message.reasoning_content, and a tool call "
                                                           "written in it is never returned")

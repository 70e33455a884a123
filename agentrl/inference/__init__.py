"""Inference: the client a run uses, and ``agentrl serve``, our own SGLang-compatible server.

    client.py         RemoteEngine: token-in/token-out client of SGLang-compatible servers
                      (interruption hidden, least-loaded routing, weight-update control calls)
    batcher.py        GroupBatcher: the requests of one event-loop tick as one /generate
    engine.py         the continuous-batching engine thread behind ``agentrl serve``
    decoder.py        weights + slot KV cache + the packed forward pass the engine runs
    prefix_cache.py   the radix tree of cached prompt prefixes (which KV entries hold what)
    sampling.py       temperature/top-k/top-p sampling with exact logprobs
    state.py          what the routes share: ServeConfig, ServerState (engine, tokenizer)
    wire.py           SGLang's ``/generate`` wire format: request validation, result shapes
    chat_format.py    the OpenAI chat format (request checks, message/tool_calls/logprobs shapes),
                      shared with the rollout gateway
    native_routes.py  SGLang's native routes (/generate, pause/continue, weight updates, info)
    weight_sync.py    SGLang's weight updates over torch.distributed (init/update/destroy a group)
    openai_routes.py  the OpenAI routes (/v1/chat/completions, /v1/completions, /v1/models)
    app.py            build_app: the three route sets in one FastAPI app

Public names: ``RemoteEngine`` and ``RemoteEngineConfig`` (importing them needs no torch). To
embed the server: ``agentrl.inference.app.build_app(ServeConfig(model=...))``.
"""

from agentrl.inference.client import RemoteEngine, RemoteEngineConfig

__all__ = ["RemoteEngine", "RemoteEngineConfig"]

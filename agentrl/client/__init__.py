"""The inference client: what a trainer, a workflow or the gateway imports to generate.

    remote_engine.py  RemoteEngine: token-in/token-out client of SGLang-compatible and vLLM
                      servers (interruption hidden, least-loaded routing, weight-update calls)
    vllm_wire.py      vLLM's request bodies, answers and control routes
    checkpoint_check.py  a checkpoint checked against the served one before vLLM loads it
    batcher.py        GroupBatcher: the requests of one event-loop tick as one /generate
    transport.py      KeepAliveTransport: pooled HTTP/1.1 connections per origin
    vllm_worker/      runs inside a vLLM server agentrl starts: agentrl_vllm_worker.py (the
                      worker extension), agentrl_vllm_auth.py (the key on every route)

No torch, no server code: the server is ``agentrl.inference`` (``agentrl serve``).
"""

from agentrl.client.remote_engine import RemoteEngine, RemoteEngineConfig

__all__ = ["RemoteEngine", "RemoteEngineConfig"]

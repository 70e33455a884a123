"""The inference client: what a trainer, a workflow or the gateway imports to generate.

    remote_engine.py  RemoteEngine: token-in/token-out client of SGLang-compatible and vLLM
                      servers (interruption hidden, least-loaded routing)
    publishing.py     WeightPublishing, RemoteEngine's base: pause, weight and adapter updates
                      (disk or torch.distributed), resume, colocated training's memory calls
    backend.py        EngineBackend: what the client needs from an engine (the protocol a
                      backend meets) and Servers, the calls the client lends it
    engines.py        ENGINES: the one registry of engines by name, each with its backend class
    sglang_backend.py SGLangBackend: SGLang's and agentrl serve's sampling keys, bodies and routes
    vllm_backend.py   VLLMBackend: vLLM's sampling keys, bodies, answers and control routes
    checkpoint_check.py  a checkpoint checked against the served one before vLLM loads it
    batcher.py        GroupBatcher: the requests of one event-loop tick as one /generate (SGLang)
    transport.py      KeepAliveTransport: pooled HTTP/1.1 connections per origin
    vllm_worker/      runs inside a vLLM server agentrl starts: the worker extension, and the key
                      on every route

No torch, no server code: the server is ``agentrl.inference`` (``agentrl serve``).
"""

from agentrl.client.remote_engine import RemoteEngine, RemoteEngineConfig

__all__ = ["RemoteEngine", "RemoteEngineConfig"]

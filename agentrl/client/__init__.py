"""The inference client: what a trainer, a workflow or the gateway imports to generate.

    remote_engine.py  RemoteEngine: token-in/token-out client of SGLang-compatible servers
                      (interruption hidden, least-loaded routing, weight-update control calls)
    batcher.py        GroupBatcher: the requests of one event-loop tick as one /generate
    transport.py      KeepAliveTransport: pooled HTTP/1.1 connections per origin

No torch, no server code: the server is ``agentrl.inference`` (``agentrl serve``).
"""

from agentrl.client.remote_engine import RemoteEngine, RemoteEngineConfig

__all__ = ["RemoteEngine", "RemoteEngineConfig"]

"""The trainer as a service: the Tinker API, so the ``tinker`` SDK and its cookbook drive agentrl.

    routes.py     the HTTP routes, as the SDK 0.38 calls them (build_app)
    registry.py   sessions, training clients, sampling sessions, ``tinker://`` checkpoints, the TTL
    futures.py    the asynchronous requests: the training queue, the long poll
    learner.py    one base model, one LoRA adapter and AdamW per training client
    sampler.py    ``sample`` / ``compute_logprobs`` through ``agentrl serve`` (per-request adapters)
    vllm_sampler.py  the same through a vLLM server (``/v1/load_lora_adapter``, ``model`` per request)
    proto.py      the three protobuf bodies of the API, read and written

The command is ``agentrl service`` (``agentrl.cli.service_command``); the losses are
``agentrl.trainer.tinker_losses``. Guide: docs/guides/tinker_service.md.
"""

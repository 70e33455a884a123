"""``agentrl serve``: our own SGLang-compatible inference server. The client is ``agentrl.client``.

    scheduler.py      Scheduler: the continuous-batching thread behind ``agentrl serve``
    decoder.py        weights + slot KV cache + the packed forward pass the scheduler runs
    prepacked.py      the projections' weights in oneDNN's layout, remade when the weights change
    hf_weights.py     reading an HF checkpoint directory into the decoder's weight layout
    lora_adapter.py   a peft LoRA adapter checked, then merged into the weights or served per request
    prefix_cache.py   the radix tree of cached prompt prefixes (which KV entries hold what)
    sampling.py       temperature/top-k/top-p sampling with exact logprobs
    serve_config.py   ServeConfig: every setting of ``agentrl serve`` (its flags are generated from it)
    state.py          what the routes share: ServerState (scheduler, tokenizer)
    wire.py           SGLang's ``/generate`` wire format: reading bodies, the result shapes
    validation.py     every generation request checked before it reaches the scheduler
    control_bodies.py the control routes' bodies, declared once (parsed and described from them)
    chat_format.py    the OpenAI chat format (request checks, message/tool_calls/logprobs shapes),
                      shared with the rollout gateway
    native_routes.py  SGLang's native routes (/generate, pause/continue, weight updates, info)
    weight_sync.py    SGLang's weight updates over torch.distributed (init/update/destroy a group)
    openai_routes.py  the OpenAI routes (/v1/chat/completions, /v1/completions, /v1/models)
    openapi.py        the routes' request bodies as JSON Schema, for ``GET /openapi.json``
    request_template.py  a chat template a request brings: refused unless trusted, else rendered
                      in a child process bounded in time and memory
    server.py         build_app: the three route sets in one FastAPI app

To embed the server: ``agentrl.inference.server.build_app(ServeConfig(model=...))``
(``agentrl.inference.serve_config``).
"""

"""agentrl: asynchronous reinforcement learning for multi-turn LLM agents.

    api.py            the contracts every part meets (Trajectory, Completion, SamplingParams, the protocols)
    errors.py         the one exception tree
    config.py         typed configs: YAML + dotted key=value overrides, flags generated from them
    plugins.py        the one place import paths and env ids are resolved; optional extras
    ids.py            unique request and call ids
    process_group.py  a torch.distributed group of its own (trainer rank 0 + the servers)
    http_edge.py      the edge our HTTP services share: API key, bounded bodies, one error body
    output_dir.py     where a command's --out may go: never an input, the run or a parent of either
    __main__.py       ``python -m agentrl`` is ``agentrl``
    toolcalls/        the model's tool-call and reasoning syntax, one module per family
    client/           RemoteEngine: the inference client
    inference/        ``agentrl serve``: our own inference server
    trainer/          the FSDP2 trainer and the publishing of its weights
    env/              what an environment author uses (TextEnv, rewards, tools)
    model/            the tiny demo model
    process/          starting our services and waiting for their ready line
    rollout/          how episodes become trajectories
    run/              a training run: config, launchers, the loop of each rank
    view/             ``agentrl view``: the run viewer
    service/          ``agentrl service``: the trainer behind the Tinker API
    cli/              the ``agentrl`` command line

The whole layout, with the extension packages around this one, is docs/DESIGN.md §2.
"""

__version__ = "0.1.0"

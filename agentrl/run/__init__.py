"""A training run: its config, the launchers of its processes, and the loop each rank runs.

    config.py        RunConfig: every section of ``agentrl train CONFIG``; check_run_config
    launcher.py      start the inference servers and the torchrun trainer ranks (one node or
                     several), watch, stop
    ray_launcher.py  the same as Ray actors on a running Ray cluster (``launcher: ray``)
    router.py        SGLang's router in front of the servers (``inference.router: sglang``)
    loop.py          ``python -m agentrl.run.loop RUN_DIR``: the asynchronous RL loop of one rank
    metrics.py       RunLog: metrics.jsonl, TensorBoard, trajectory samples, the record, curves.png
    replay.py        ``agentrl replay``: recorded episodes re-scored with another reward function
    sft_config.py    SftConfig: every key of ``agentrl sft CONFIG``
    sft_data.py      conversations and recorded trajectories as SFT examples (ids + loss mask)
    sft.py           ``agentrl sft``'s run: the trainer's Actor on NLL batches, held-out loss, HF export

This package sits above the rollout side and the trainer, which it joins; only the CLI is above it.
"""

"""A training run: its config, the launchers of its processes, and the loop each rank runs.

    run_config.py    RunConfig: every section of ``agentrl train CONFIG``, composed from each
                     component's own; check_run_config (one check per thing checked); build_workflow
    inference_config.py  InferenceConfig: the servers a run starts or uses, and its client
    placement.py     placement and rollout.worker resolved from ``auto``; where processes may go
    local_launcher.py  start the inference servers and the torchrun trainer ranks (one node or
                     several), watch, stop
    ray_launcher.py  the same as Ray actors on a running Ray cluster (``launcher: ray``)
    router.py        SGLang's router in front of the servers (``inference.router: sglang``)
    loop.py          ``python -m agentrl.run.loop RUN_DIR``: the asynchronous RL loop of one rank
                     (rank 0's Leader: set up → steps → save → clean up)
    rollout_side.py  RolloutSide: what rank 0 drives each step; LocalRollout: it in rank 0's loop
    rollout_process.py  RolloutProcess: the same in a child process, over a socket pair
    run_lock.py      RunLock: one ``agentrl train`` or ``agentrl eval`` writes a run directory at a time
    metrics.py       RunLog: metrics.jsonl, TensorBoard, trajectory samples, the record, curves.png
    replay.py        ``agentrl replay``: recorded episodes re-scored with another reward function
    sft_config.py    SftConfig: every key of ``agentrl sft CONFIG``
    sft_data.py      conversations and recorded trajectories as SFT examples (ids + loss mask)
    sft.py           ``agentrl sft``'s run: the trainer's Actor on NLL batches, held-out loss, HF export

This package sits above the rollout side and the trainer, which it joins; only the CLI is above it.
"""

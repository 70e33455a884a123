"""A training run: its config, the launchers of its processes, and the loop each rank runs.

    run_config.py     RunConfig: every section of ``agentrl train CONFIG``; check_run_config
    local_launcher.py start the inference servers and the torchrun trainer ranks (one node or
                      several), watch, stop
    ray_launcher.py   the same as Ray actors on a running Ray cluster (``launcher: ray``)
    router.py         SGLang's router in front of the servers (``inference.router: sglang``)
    run_lock.py       the lock of a run directory: one train or eval writes it at a time
    loop.py           ``python -m agentrl.run.loop RUN_DIR``: the asynchronous RL loop of one rank
    rollout_side.py   rank 0's rollout side: in its event loop, or a child process over a socket pair
    metrics.py        RunLog: metrics.jsonl, TensorBoard, trajectory samples, the record, curves.png
    replay.py         ``agentrl replay``: recorded episodes re-scored with another reward function
    sft_config.py     SftConfig: every key of ``agentrl sft CONFIG``
    sft_data.py       conversations and recorded trajectories as SFT examples (ids + loss mask)
    sft.py            ``agentrl sft``'s run: the trainer's Actor on NLL batches, held-out loss, HF export

This package sits above the rollout side and the trainer, which it joins; only the CLI is above it.
"""

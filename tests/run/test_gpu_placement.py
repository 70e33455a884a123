"""Where a run's processes go on GPUs, decided before anything starts.

Found on an H200 (benchmarks/gpu_check.py, one GPU): with ``trainer.weight_sync.transport:
distributed`` the trainer rank and ``agentrl serve`` shared the GPU, NCCL refused the weight
group ("Duplicate GPU detected : rank 1 and rank 0 both on CUDA device") and the run died after
its servers had started. The config check now refuses it in one line; a server gets a GPU of its
own after the trainer's when the machine has one. The GPU count is faked here (this machine has
none): these are unit tests of the placement rule, not of CUDA.
"""

from __future__ import annotations

import pytest
import torch

from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.run.local_launcher import server_has_own_gpu
from agentrl.run.run_config import RunConfig, check_run_config


def config(*overrides: str) -> RunConfig:
    return load_config(RunConfig, "examples/arith_grpo.yaml", ["device=cuda", *overrides])


def test_a_server_gets_its_own_gpu_after_the_trainer_ranks_when_there_is_one():
    cfg = config("world_size=2", "inference.num_servers=2")
    assert [server_has_own_gpu(cfg, i, 4) for i in range(2)] == [True, True]  # GPUs 2 and 3
    assert [server_has_own_gpu(cfg, i, 3) for i in range(2)] == [True, False]
    assert not server_has_own_gpu(config("world_size=1"), 0, 1)
    assert not server_has_own_gpu(config("device=cpu"), 0, 8)


def test_nccl_weights_to_a_server_on_the_trainers_gpu_are_refused_by_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"'trainer.weight_sync.transport'.*NCCL.*one GPU.*transport: disk"):
        check_run_config(config("trainer.weight_sync.transport=distributed"))
    check_run_config(config())  # through the disk: fine on one shared GPU
    check_run_config(config("trainer.weight_sync.transport=distributed", "trainer.weight_sync.backend=gloo"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # the server has GPU 1
    check_run_config(config("trainer.weight_sync.transport=distributed"))

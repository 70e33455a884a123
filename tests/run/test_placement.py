"""The config keys that place a run's processes: each impossible placement is one ConfigError that
names its key, before anything starts; the torchrun line carries torchrun's own flags.

``placement: auto`` picks colocated where the servers would share the trainer's GPU and
decoupled elsewhere (on a CPU too: measured faster there), and says why; colocated gives each
phase every core. A started server gets a GPU of its own after the trainer's when there is one,
and weights over NCCL to a server on the trainer's GPU are refused (on one H200 NCCL answered
"Duplicate GPU detected" after the servers had started). The machine's cores and GPUs are
faked in those tests: unit tests of the rules.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.run import placement as placement_policy
from agentrl.run.local_launcher import server_has_own_gpu, torchrun_command
from agentrl.run.placement import apply_placement, apply_rollout_worker, choose_placement
from agentrl.run.run_config import RunConfig, check_run_config

ROOT = Path(__file__).resolve().parents[2]


def config(*overrides: str) -> RunConfig:
    return load_config(RunConfig, ROOT / "examples" / "arith_grpo.yaml", [f"model={ROOT / 'examples/tiny-model'}",
                                                                           *overrides])


@pytest.mark.parametrize(("overrides", "key", "words"), [
    (["world_size=3", "nnodes=2", "master_port=29500"], "'world_size'", "split evenly"),
    (["nnodes=2", "world_size=2", "node_rank=2", "master_port=29500"], "'node_rank'", "not below nnodes=2"),
    (["nnodes=2", "world_size=2"], "'master_port'", "fixed rendezvous port"),
    (["launcher=ray", "nnodes=2", "world_size=2", "master_port=29500"], "'nnodes'", "Ray places the ranks"),
    (["sandbox.services=[http://127.0.0.1:8100]"], "'sandbox.services'", "takes no sandbox"),
    (["sandbox.backend=docker"], "'sandbox.backend'", "takes no sandbox"),
    (["rollout.workflow_args.env_id=agentrl/Code-v0", "sandbox.services=[127.0.0.1:8100]"], "'sandbox.services'",
     "is not a URL"),
    (["launcher=rey"], "'launcher'", "did you mean 'ray'"),
    (["placement=colocated", "nnodes=2", "world_size=2", "master_port=29500"], "'placement'",
     "colocated runs on one machine"),
    (["inference.router=sglng"], "'inference.router'", "did you mean 'sglang'"),
    (["trainer.lora.rank=8", "inference.client.engine=vllm", "trainer.weight_sync.adapters=merge"],
     "'trainer.weight_sync.adapters'", "merge needs agentrl serve (vllm cannot"),
    (["trainer.lora.rank=8", "inference.engine=sglang", "inference.servers=[http://127.0.0.1:9]",
      "trainer.weight_sync.adapters=merge"], "'trainer.weight_sync.adapters'", "merge needs agentrl serve"),
    (["trainer.lora.rank=8", "inference.engine=sglang", "inference.servers=[http://127.0.0.1:9]",
      "trainer.weight_sync.transport=distributed"], "'trainer.weight_sync.transport'",
     "adapter is broadcast to agentrl serve only (sglang loads adapters from disk); use transport: disk"),
    (["trainer.lora.rank=8", "inference.client.engine=vllm", "trainer.weight_sync.transport=distributed"],
     "'trainer.weight_sync.transport'", "adapter is broadcast to agentrl serve only (vllm loads"),
    (["deterministic=true", "inference.client.engine=vllm"], "'deterministic'", "not batch-invariant"),
    (["deterministic=true", "placement=colocated"], "'placement'", "overlap_rounds"),
    (["inference.release_memory=true"], "'inference.release_memory'", "needs placement colocated"),
    (["deterministic=true", "rollout.sampling.stop=[</answer>]"], "'rollout.sampling'", "stop strings"),
    (["deterministic=true", "rollout.worker=process"], "'rollout.worker'", "process cannot run with deterministic"),
    (["rollout.source=gateway", "rollout.worker=process"], "'rollout.worker'", "process cannot run with "
                                                                              "rollout.source gateway"),
])
def test_impossible_placements_name_their_key(overrides, key, words):
    with pytest.raises(ConfigError) as e:
        cfg = config(*overrides)
        check_run_config(cfg)
        apply_placement(cfg)  # what only the machine decides (auto)
    assert key in str(e.value) and words in str(e.value)


def test_a_code_env_takes_sandbox_services_as_one_fleet_spec():
    cfg = config("rollout.workflow_args.env_id=agentrl/Code-v0",
                 "sandbox.services=[http://10.0.0.1:8100,http://10.0.0.2:8100]")
    check_run_config(cfg)
    assert cfg.sandbox.spec() == "http://10.0.0.1:8100,http://10.0.0.2:8100"


def test_the_torchrun_line_of_each_node(tmp_path):
    cfg = config("world_size=16", "nnodes=2", "node_rank=1", "master_addr=10.0.0.7", "master_port=29500")
    cmd = torchrun_command(cfg, tmp_path)
    flags = dict(zip(cmd[3:-3:2], cmd[4:-3:2], strict=True))
    assert cmd[1:3] == ["-m", "torch.distributed.run"] and cmd[-3:] == ["-m", "agentrl.run.loop", str(tmp_path)]
    assert flags == {"--nnodes": "2", "--node-rank": "1", "--nproc-per-node": "8", "--master-addr": "10.0.0.7",
                     "--master-port": "29500"}
    one = torchrun_command(config(), tmp_path)  # one node: a free port on loopback
    assert one[one.index("--master-addr") + 1] == "127.0.0.1" and int(one[one.index("--master-port") + 1]) > 0


@pytest.mark.parametrize(("overrides", "placement", "why"), [
    ([], "decoupled", "a CPU"),
    (["rollout.source=gateway"], "decoupled", "rollout.source gateway"),
    (["inference.servers=[http://127.0.0.1:1]"], "decoupled", "inference.servers run elsewhere"),
    (["launcher=ray"], "decoupled", "launcher ray"),
    (["placement=colocated"], "colocated", "placement set"),
])
def test_auto_picks_by_the_machine_and_says_why(overrides, placement, why):
    got, reason = choose_placement(config(*overrides))
    assert got == placement and why in reason


@pytest.mark.parametrize(("overrides", "worker", "why"), [
    ([], "process", "interpreter lock"),
    (["placement=colocated"], "process", "interpreter lock"),
    (["deterministic=true"], "thread", "deterministic mode"),
    (["rollout.source=gateway"], "thread", "rollout.source gateway"),
    (["rollout.worker=thread"], "thread", "rollout.worker set"),
])
def test_auto_puts_the_episodes_in_a_process_of_their_own_where_they_can_go(overrides, worker, why):
    cfg = config(*overrides)
    line = apply_rollout_worker(cfg)
    assert cfg.rollout.worker == worker and line.startswith(f"rollout.worker {worker} (") and why in line


@pytest.mark.parametrize(("gpus", "placement"), [(1, "colocated"), (2, "decoupled")])
def test_on_gpus_colocated_when_the_servers_would_share_the_trainers(monkeypatch, gpus, placement):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    assert choose_placement(config("device=cuda"))[0] == placement


def test_colocated_gives_each_phase_every_core(monkeypatch):
    monkeypatch.setattr(placement_policy, "usable_cores", lambda: 8)
    cfg = config("placement=colocated", "world_size=2", "inference.num_servers=2")
    line = apply_placement(cfg)
    assert (cfg.placement, cfg.threads, cfg.inference.threads) == ("colocated", 4, 4)
    assert "take turns, each with all 8 cores (threads=4, inference.threads=4)" in line
    cfg = config("placement=auto")
    assert apply_placement(cfg).startswith("placement decoupled (a CPU")
    assert (cfg.placement, cfg.threads, cfg.inference.threads) == ("decoupled", 1, 1)  # the YAML's, untouched


def test_a_server_gets_its_own_gpu_after_the_trainer_ranks_when_there_is_one():
    cfg = config("device=cuda", "world_size=2", "inference.num_servers=2")
    assert [server_has_own_gpu(cfg, i, 4) for i in range(2)] == [True, True]  # GPUs 2 and 3
    assert [server_has_own_gpu(cfg, i, 3) for i in range(2)] == [True, False]
    assert not server_has_own_gpu(config("device=cuda", "world_size=1"), 0, 1)
    assert not server_has_own_gpu(config("device=cpu"), 0, 8)


def test_nccl_weights_to_a_server_on_the_trainers_gpu_are_refused_by_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"'trainer.weight_sync.transport'.*NCCL.*one GPU.*transport: disk"):
        check_run_config(config("device=cuda", "trainer.weight_sync.transport=distributed"))
    check_run_config(config("device=cuda"))  # through the disk: fine on one shared GPU
    check_run_config(config("device=cuda", "trainer.weight_sync.transport=distributed",
                            "trainer.weight_sync.backend=gloo"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # the server has GPU 1
    check_run_config(config("device=cuda", "trainer.weight_sync.transport=distributed"))


@pytest.mark.parametrize(("overrides", "gpus", "release"), [
    (["placement=colocated"], 0, False),  # a CPU: RAM is rarely what training lacks
    (["placement=colocated", "inference.release_memory=true"], 0, True),
    (["device=cuda"], 1, True),  # null: colocated on the trainer's GPU, which training needs
    (["device=cuda", "inference.release_memory=false"], 1, False),
    (["device=cuda"], 2, False),  # decoupled: nothing to give back
])
def test_colocated_servers_release_their_memory_where_training_needs_it(monkeypatch, overrides, gpus, release):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    cfg = config(*overrides)
    line = apply_placement(cfg)
    assert cfg.inference.release_memory == release
    assert ("memory released" in line) == release

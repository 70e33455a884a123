"""The config keys that place a run's processes: each impossible placement is one ConfigError that
names its key, before anything starts; the torchrun line carries torchrun's own flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.run.local_launcher import torchrun_command
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
    (["inference.router=sglng"], "'inference.router'", "did you mean 'sglang'"),
])
def test_impossible_placements_name_their_key(overrides, key, words):
    with pytest.raises(ConfigError) as e:
        check_run_config(config(*overrides))
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

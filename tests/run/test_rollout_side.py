"""The rollout side's two homes meet one declared protocol (issue 43: ``LocalRollout`` and
``RolloutProcess`` mirrored eleven methods with nothing between them, and the loop typed them
``Any``). A signature check: the loop's real runs in both homes are tests/run/test_train.py (a
rollout process) and test_gateway_training.py / test_deterministic_run.py (in rank 0)."""

from __future__ import annotations

import inspect

from agentrl.run.rollout_process import CALLS, RolloutProcess
from agentrl.run.rollout_side import LocalRollout, RolloutSide


def protocol_methods() -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in vars(RolloutSide).items()
            if inspect.isfunction(member) and not name.startswith("_")}


def test_both_homes_take_every_call_of_the_protocol_as_it_declares_it():
    declared = protocol_methods()
    assert {"open", "start", "next_batch", "publish", "stop", "aclose"} <= set(declared)
    for home in (LocalRollout, RolloutProcess):
        for name, signature in declared.items():
            method = getattr(home, name)
            assert inspect.iscoroutinefunction(method), (home, name)
            params = list(inspect.signature(method).parameters.values())
            wanted = list(signature.parameters)
            assert [p.name for p in params[: len(wanted)]] == wanted, (home, name)
            assert all(p.default is not p.empty or p.kind is p.VAR_KEYWORD for p in params[len(wanted):]), (home, name)


def test_the_process_answers_every_call_rank_0_sends_it():
    # publish runs in rank 0 (it wraps the trainer's publish) and sends set_version to the child
    assert set(protocol_methods()) - {"publish"} | {"set_version"} <= CALLS
    assert all(callable(getattr(LocalRollout, call)) for call in CALLS)

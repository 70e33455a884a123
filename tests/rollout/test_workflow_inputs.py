"""What a run gives the workflow it builds: what the class declares in ``run_inputs`` (issue 43:
the run read every constructor's signature to guess); a class that declares nothing still gets
what its constructor names; an argument the config sets is never replaced. Fake workflow classes:
unit tests of the building rule (the run builds the real ones in tests/run and tests/toolcalls)."""

from __future__ import annotations

import inspect

import pytest

from agentrl.api import SamplingParams, Workflow
from agentrl.errors import ConfigError
from agentrl.rollout.workflow_inputs import RUN_INPUTS, WorkflowInputs, build_workflow, close_workflow

INPUTS = WorkflowInputs(tokenizer="models/m", sampling=SamplingParams(max_new_tokens=8), tool_call_parser="hermes",
                        reasoning_parser="qwen3", sandbox="http://127.0.0.1:8100")


class Declared:
    run_inputs = ("tokenizer", "env_kwargs")

    def __init__(self, tokenizer, sampling=None, env_kwargs=None, max_turns=1):
        self.tokenizer, self.sampling, self.env_kwargs, self.max_turns = tokenizer, sampling, env_kwargs, max_turns


class Undeclared:  # written before run_inputs: takes what its constructor names
    def __init__(self, tokenizer, sampling):
        self.tokenizer, self.sampling = tokenizer, sampling


def test_a_declared_workflow_gets_what_it_declares_and_no_more():
    wf = build_workflow(Declared, {"max_turns": 3, "env_kwargs": {"size": 2}}, INPUTS, name="t:Declared")
    assert (wf.tokenizer, wf.sampling, wf.max_turns) == ("models/m", None, 3)  # sampling: not declared
    assert wf.env_kwargs == {"sandbox": "http://127.0.0.1:8100", "size": 2}  # the run's sandbox, the config's kwargs


def test_an_undeclared_workflow_gets_the_inputs_its_constructor_names():
    wf = build_workflow(Undeclared, {}, INPUTS, name="t:Undeclared")
    assert (wf.tokenizer, wf.sampling) == ("models/m", INPUTS.sampling)


def test_the_config_wins_and_mistakes_name_their_key():
    wf = build_workflow(Undeclared, {"tokenizer": "other"}, INPUTS, name="t:Undeclared")
    assert wf.tokenizer == "other"
    with pytest.raises(ConfigError, match=r"'eval.workflow_args': t:Declared takes no argument \['turns'\]"):
        build_workflow(Declared, {"turns": 3}, INPUTS, name="t:Declared", key="eval.workflow_args")
    Declared.run_inputs = ("tokeniser",)
    try:
        with pytest.raises(ConfigError, match=r"Declared.run_inputs: expected a tuple of names from"):
            build_workflow(Declared, {}, INPUTS, name="t:Declared")
    finally:
        Declared.run_inputs = ("tokenizer", "env_kwargs")


def test_every_shipped_workflow_declares_inputs_its_constructor_takes():
    from workflows.env import EnvWorkflow
    from workflows.external_agent import ExternalAgentWorkflow
    from workflows.self_play import SelfPlayWorkflow
    from workflows.single_turn import SingleTurnWorkflow
    from workflows.tool_agent import ToolAgentWorkflow
    from workflows.verifiers_harness import VerifiersWorkflow

    for cls in (EnvWorkflow, ExternalAgentWorkflow, SelfPlayWorkflow, SingleTurnWorkflow, ToolAgentWorkflow,
                VerifiersWorkflow):
        params = inspect.signature(cls).parameters
        assert "run_inputs" in vars(cls) and set(cls.run_inputs) <= set(RUN_INPUTS) & set(params), cls


async def test_aclose_is_part_of_the_contract_and_optional():
    class Holds(Workflow):
        closed = False

        async def arun_episode(self, client, row):
            return None

        async def aclose(self):
            self.closed = True

    class HoldsNothing(Workflow):
        async def arun_episode(self, client, row):
            return None

    held, plain = Holds(), HoldsNothing()
    await close_workflow(held)
    await close_workflow(plain)  # the protocol's default: nothing to release
    await close_workflow(Undeclared("m", None))  # a workflow that leaves aclose out
    assert held.closed

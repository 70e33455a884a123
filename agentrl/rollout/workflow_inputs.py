"""WorkflowInputs: what a run gives the workflow it builds, and the building itself.

What it is: the run's side of the workflow contract (``agentrl.api.Workflow``). A workflow class
named in a config (``rollout.workflow``) is built once with ``rollout.workflow_args`` as keyword
arguments, plus those of the run's inputs it declares in ``run_inputs``, a class attribute that
names some of ``RUN_INPUTS``::

    class MyWorkflow:
        run_inputs = ("tokenizer", "sampling")     # the model directory, rollout.sampling

        def __init__(self, tokenizer, sampling, max_turns=4): ...

``tokenizer`` is the run's model directory, ``sampling`` the rollouts' (or the evaluation's)
``SamplingParams``, ``tool_call_parser``/``reasoning_parser`` the run's formats, and
``env_kwargs`` the workflow's env arguments with the run's sandbox added (``sandbox``). An
argument the config gives itself is never replaced. A class that declares nothing is built as
before ``run_inputs`` existed: it gets the inputs its constructor names (read once from its
signature, which also checks ``workflow_args``). Main hooks: ``build_workflow``,
``check_workflow_args``, ``close_workflow`` (its end). What it is not: the workflows (``workflows/``) or the run config.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentrl.api import SamplingParams
from agentrl.errors import ConfigError

RUN_INPUTS = ("tokenizer", "sampling", "tool_call_parser", "reasoning_parser", "env_kwargs")
"""What a workflow class may name in ``run_inputs``."""


@dataclass(frozen=True)
class WorkflowInputs:
    """The run's values a workflow may take (see the module doc)."""

    tokenizer: str
    sampling: SamplingParams
    tool_call_parser: str
    reasoning_parser: str | None = None
    sandbox: str = ""
    """What code envs get as their ``sandbox`` argument ("" : the env's default)."""

    def arguments(self, names: tuple[str, ...], given: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments of ``names`` (``RUN_INPUTS``) that ``given`` does not set itself."""
        out: dict[str, Any] = {}
        for name in names:
            if name == "env_kwargs":
                if self.sandbox:
                    out[name] = {"sandbox": self.sandbox, **(given.get(name) or {})}
            elif name not in given:
                out[name] = getattr(self, name)
        return out


def run_inputs(cls: Any) -> tuple[str, ...]:
    """What ``cls`` takes from the run: its ``run_inputs``, checked; undeclared, the ``RUN_INPUTS``
    its constructor names."""
    declared = getattr(cls, "run_inputs", None)
    if declared is None:
        params = constructor_parameters(cls) or {}
        return tuple(name for name in RUN_INPUTS if name in params)
    unknown = sorted(set(declared) - set(RUN_INPUTS))
    if isinstance(declared, str) or unknown:
        raise ConfigError(f"{getattr(cls, '__qualname__', cls)}.run_inputs: expected a tuple of names from "
                          f"{list(RUN_INPUTS)}, got {declared!r}")
    return tuple(declared)


def build_workflow(cls: Any, args: Mapping[str, Any], inputs: WorkflowInputs, *, name: str,
                   key: str = "rollout.workflow_args") -> Any:
    """``cls(**args, **inputs it takes)``, its arguments checked first (``name``: its import path,
    ``key``: the config key of ``args``, for the errors)."""
    kwargs = {**args, **inputs.arguments(run_inputs(cls), args)}
    check_workflow_args(cls, name, kwargs, key)
    return cls(**kwargs)


async def close_workflow(workflow: Any) -> None:
    """``workflow.aclose()`` (``Workflow.aclose``), which a workflow that holds nothing may leave out."""
    aclose = getattr(workflow, "aclose", None)
    if aclose is not None:
        await aclose()


def constructor_parameters(cls: Any) -> Mapping[str, inspect.Parameter] | None:
    """The parameters of ``cls``'s constructor, or None where Python cannot tell (a builtin)."""
    try:
        return inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return None


def check_workflow_args(cls: Any, name: str, args: Mapping[str, Any], key: str) -> None:
    """Refuse arguments the workflow ``cls`` does not take, naming the config key."""
    params = constructor_parameters(cls)
    if params is None or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return  # no signature to read, or it takes anything: the call itself will say
    unknown = sorted(set(args) - set(params))
    if unknown:
        raise ConfigError(f"config key '{key}': {name} takes no argument {unknown} (its arguments: "
                          f"{[k for k in params if k != 'self']}); an episode's time budget is the workflow's own "
                          "timeout_s")

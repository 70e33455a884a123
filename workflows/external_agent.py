"""ExternalAgentWorkflow: an episode played by another program through the gateway.

What it is: the workflow for agents that are not Python coroutines of ours — a script, a
binary, an agent framework in another language. For each episode it opens a gateway session
(an in-process ``Gateway`` served on 127.0.0.1 from this event loop, generation going to the
episode's inference client), starts ``command`` with::

    OPENAI_BASE_URL       the session's OpenAI base URL (…/v1): any OpenAI client finds it
    OPENAI_API_KEY        the session's key
    AGENTRL_SESSION_URL   …/v1/sessions/<id>: POST /reward, /end, and /step when an env is bound
    AGENTRL_MCP_URL       …/sessions/<id>/mcp: the env's tools as an MCP server (streamable
                          HTTP, the session's key as bearer), when the env offers tools

and writes the task on its stdin as one JSON object: ``{"task": row}``, plus, when
``env_id`` is set, ``"messages"`` (the env's opening messages) and ``"tools"``. With an env,
the agent submits each reply with ``POST {AGENTRL_SESSION_URL}/step`` (optionally
``{"completion_id": ...}``; default the latest call): the env steps on the exact sampled
text and answers ``{"messages", "reward", "terminated", "truncated", "info"}``, and the
reward is recorded on that call; the last step's facts and reward terms become the
trajectories' metrics (``reward/<term>``). An agent that runs the env's tools over MCP
(``examples/mcp_agent.py``: the OpenAI Agents SDK) has them counted by the env as its own
calls (``TextEnv.call_tool``). Without an env the agent posts its reward itself. When the
process exits the session ends (if the agent did not end it) and its trajectories — exact
tokens of every call the agent made — are the episode's.

Failures are data: an agent that exits non-zero ends the episode as ``env_error`` (its
stderr's tail in ``error``), one that runs past ``timeout_s`` is killed (``timeout``); the
tokens recorded so far are kept on the failed trajectories. ``examples/external_agent.py``
is an agent written with the ``openai`` SDK that plays any shipped env this way.

What it is not: a sandbox for the agent program (it runs with this process's rights).

Main hook::

    wf = ExternalAgentWorkflow([sys.executable, "examples/external_agent.py"], "examples/tiny-model",
                               env_id="agentrl/ToolUse-v0")
    trajectories = await wf.arun_episode(engine, row)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from agentrl.api import InferenceClient, Trajectory, TrajectoryStatus
from agentrl.process.services import background_server
from agentrl.rollout.env_pool import EnvPool
from agentrl.rollout.episode import guarded, step_metrics
from agentrl.rollout.gateway import Gateway, Session
from agentrl.rollout.gateway_routes import build_app
from agentrl.rollout.renderer import ChatRenderer


class EnvTools:
    """An episode's env tools as a gateway session serves them over MCP (``SessionTools``)."""

    def __init__(self, env: Any, schemas: list[dict[str, Any]]) -> None:
        self.env, self._schemas = env, schemas

    def schemas(self) -> list[dict[str, Any]]:
        return self._schemas

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        return await self.env.call_tool(name, arguments)


class ExternalAgentWorkflow:
    """Run ``command`` once per episode against a gateway session; see the module docstring.

    ``command``: argv (or a shell-style string; a first word ``python`` is this process's own
    interpreter, so a run's YAML can name a Python agent without knowing its venv); ``tokenizer``: model directory or tokenizer;
    ``env_id``/``env_kwargs``: an env the agent steps through the session (None: the agent
    rewards itself); ``timeout_s``: wall time of one episode; ``discount``: γ for returns;
    ``style``: export style; ``max_session_tokens``/``context_length``: the session's limits;
    ``extra_env``: more environment variables for the agent; ``cwd``: its working directory;
    ``agent_sampling``: ``policy`` (the default: every call samples the policy's own distribution,
    what the trainer recomputes) or ``agent`` (the agent's temperature and filters reach the
    engine: for evaluation, e.g. a greedy agent) — ``GatewayConfig.agent_sampling``.
    """

    run_inputs: ClassVar[tuple[str, ...]] = ("tokenizer", "env_kwargs")
    """What it takes from a run (``agentrl.rollout.workflow_inputs``)."""

    def __init__(self, command: Sequence[str] | str, tokenizer: str | Path | Any, env_id: str | None = None,
                 env_kwargs: Mapping[str, Any] | None = None, *, timeout_s: float = 900.0, discount: float = 1.0,
                 style: str = "concat", max_session_tokens: int | None = 65536, context_length: int | None = None,
                 extra_env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
                 max_idle_envs: int = 256, agent_sampling: str = "policy") -> None:
        self.command = shlex.split(command) if isinstance(command, str) else list(command)
        if not self.command:
            raise ValueError("command must name the agent program to run")
        if self.command[0] == "python":
            self.command[0] = sys.executable
        if style not in ("concat", "individual"):
            raise ValueError(f"style must be 'concat' or 'individual', got {style!r}")
        self.renderer = ChatRenderer(tokenizer)
        self.envs = EnvPool(env_id, env_kwargs, max_idle=max_idle_envs) if env_id else None
        self.timeout_s, self.discount, self.style = timeout_s, discount, style
        self.extra_env, self.cwd = dict(extra_env or {}), cwd
        self.gateway = Gateway(None, self.renderer, max_session_tokens=max_session_tokens,
                               context_length=context_length, session_timeout_s=timeout_s * 2,
                               agent_sampling=agent_sampling)
        self._url: str | None = None
        self._server: contextlib.AsyncExitStack | None = None
        self._starting = asyncio.Lock()

    async def arun_episode(self, client: InferenceClient, row: Mapping[str, Any]) -> list[Trajectory] | None:
        what = f"external agent episode ({self.command[0]})"
        return await guarded(self._play(client, row), timeout_s=None, what=what)

    async def aclose(self) -> None:
        """Stop the gateway and close the pooled envs."""
        if self._server is not None:
            await self._server.aclose()
            self._server = None
        if self.envs is not None:
            await self.envs.aclose()

    async def _base_url(self) -> str:
        async with self._starting:
            if self._url is None:
                stack = contextlib.AsyncExitStack()
                self._url = await stack.enter_async_context(background_server(build_app(self.gateway)))
                self._server = stack
        return self._url

    async def _play(self, client: InferenceClient, row: Mapping[str, Any]) -> list[Trajectory]:
        url = await self._base_url()
        if self.envs is None:
            return await self._run(client, url, row, {"task": dict(row)}, None)
        async with self.envs.lease() as env:
            obs, info = await self.envs.reset(env, row)

            last: dict[str, Any] = {}

            async def step(reply: str) -> dict[str, Any]:
                obs, reward, terminated, truncated, step_info = await self.envs.step(env, reply)
                last.update(info=step_info, terminated=bool(terminated), truncated=bool(truncated))
                return {"messages": obs, "reward": float(reward), "terminated": bool(terminated),
                        "truncated": bool(truncated), "info": json.loads(json.dumps(step_info, default=str))}

            task = {"task": dict(row), "messages": obs, "tools": info.get("tools")}
            tools = EnvTools(env, info.get("tools")) if info.get("tools") else None
            trajectories = await self._run(client, url, row, task, step, tools)
            if last:
                metrics = step_metrics(last["info"], terminated=last["terminated"], truncated=last["truncated"])
                for t in trajectories:
                    t.metrics.update(metrics)
            return trajectories

    async def _run(self, client: InferenceClient, url: str, row: Mapping[str, Any], task: dict[str, Any],
                   step: Any, tools: EnvTools | None = None) -> list[Trajectory]:
        session = self.gateway.open_session({"row": dict(row)}, engine=client, stepper=step, tools=tools)
        env = {**os.environ, **self.extra_env, "OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": session.key,
               "AGENTRL_SESSION_URL": f"{url}/v1/sessions/{session.id}"}
        if tools is not None:
            env["AGENTRL_MCP_URL"] = f"{url}/sessions/{session.id}/mcp"
        status, error = None, ""
        proc = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, env=env, cwd=self.cwd)
        try:
            async with asyncio.timeout(self.timeout_s):
                _, stderr = await proc.communicate(json.dumps(task, default=str).encode())
            if proc.returncode != 0:
                tail = stderr.decode(errors="replace")[-1500:]
                status, error = TrajectoryStatus.ENV_ERROR, f"the agent exited with code {proc.returncode}: {tail}"
        except TimeoutError:
            status, error = TrajectoryStatus.TIMEOUT, f"the agent ran past its budget of {self.timeout_s} s"
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        if status is None and not session.ended:
            await self._agent_done(session, row)
        return await self._finish(session, status, error)

    async def _agent_done(self, session: Session, row: Mapping[str, Any]) -> None:
        """Called when the agent exited well and left its session open: a subclass may grade the
        episode here and reward the session (``session.chat.set_last_reward``)."""

    async def _finish(self, session: Session, status: TrajectoryStatus | None, error: str) -> list[Trajectory]:
        if not session.ended:
            await self.gateway.end_session(session.id, discount=self.discount, style=self.style,  # type: ignore[arg-type]
                                           status=status, error=error)
        elif status is not None:  # the agent ended its session, then failed
            for t in session.trajectories:
                t.status, t.error = status, error
        trajectories = session.trajectories or [Trajectory.failed(status or TrajectoryStatus.ENV_ERROR,
                                                                  error=error or "the agent made no call")]
        for t in trajectories:
            t.episode_id = ""  # the executor names episodes
            t.metrics.setdefault("turns", float(len(session.chat.conversation.calls)))
        return trajectories

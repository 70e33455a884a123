"""RepoEnv (``agentrl/Repo-v0``): a repository in a container, shell and editor tools, graded by its tests.

What it is: the env of repository tasks — SWE-bench instances and Harbor task directories,
read unchanged (``envs/repo/tasks.py``). An episode holds one container of the task's image
from the warm pool (``sandboxes/repo_pool.py``; or on sandbox services, ``sandboxes/repo_remote.py``), destroyed when the episode ends; the model
works through the tools ``bash``, ``str_replace_editor`` (``envs/repo/editor.py``) and
``submit``, offered in its family's tool-call format (``ToolBox``; more tools can be added
with ``extra_tools`` and MCP servers' with ``mcp_servers``; a Harbor task's own
``[[environment.mcp_servers]]`` join for its episodes, a stdio one run inside the episode's
container: ``harbor_mcp_configs``). Grading (``envs/repo/grading.py``) runs the task's own tests: for
SWE-bench in a fresh container, for Harbor with the verifier copied in only after the agent.

What it is not: an agent loop (``workflows.env:EnvWorkflow`` plays it reply by reply,
``workflows.tool_agent:ToolAgentWorkflow`` with an OpenAI-style agent).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentrl.api import Message
from agentrl.env.mcp_tools import MCPServerConfig, mcp_sources
from agentrl.env.rewards import Reward, Rubric, fact
from agentrl.env.text_env import EpisodeLimits, TextEnv, Turn
from agentrl.env.tools import Tool, ToolBox, tool
from agentrl.errors import EnvError
from agentrl.toolcalls import DEFAULT_TOOL_PARSER
from envs.repo.editor import COMMANDS, Command, FileEditor, offered_parameters
from envs.repo.grading import agent_diff, grade_harbor, grade_swebench, place_files
from envs.repo.tasks import RepoTask, load_tasks, read_task
from sandboxes.repo_container import ContainerSpec
from sandboxes.repo_pool import RepoPool, RepoPoolConfig, RepoSession, shared_repo_pool
from sandboxes.repo_remote import RemoteRepoSession, RepoFleet, shared_repo_fleet

TOOLS = ("bash", "str_replace_editor", "submit")
PROMPT = """{instruction}

You are working in a repository at {workdir} inside a Linux container. Use the tools: `bash` runs one shell
command (the working directory and environment persist between calls), `str_replace_editor` views, creates and
edits files. Make the change the task asks for, then call `submit`."""
TEST_PATTERN = r"\bpytest\b|\btox\b|\bnox\b|unittest|manage\.py test|\bmake (test|check)\b"
"""What a ``bash`` command that runs tests looks like (the ``ran_tests`` fact)."""


@functools.lru_cache(maxsize=8)
def _rows(path: str) -> tuple[dict[str, Any], ...]:
    return tuple(load_tasks(path))


def _services(sandbox: str | Sequence[str]) -> tuple[str, ...]:
    """The sandbox services' URLs in ``sandbox`` (none: the local engine)."""
    urls = [u.strip() for u in (sandbox.split(",") if isinstance(sandbox, str) else sandbox) if u.strip()]
    if urls == ["docker"]:
        return ()
    if not all(u.startswith(("http://", "https://")) for u in urls):
        raise EnvError(f"agentrl/Repo-v0 runs its containers on the Docker engine (sandbox: '' or 'docker') or on "
                       f"sandbox services (sandbox: their http:// URLs), got {sandbox!r}")
    return tuple(urls)


def harbor_mcp_configs(servers: Sequence[dict[str, Any]], *, container: str, workdir: str,
                       docker_host: str) -> list[MCPServerConfig]:
    """A Harbor task's MCP servers (``RepoTask.mcp_servers``) for one episode. Harbor hands
    them to an agent that runs inside the task's container, so a stdio server runs there too:
    ``docker exec -i`` into the episode's ``container`` (the docker CLI, on ``docker_host``), its
    stdin and stdout the protocol's. A URL (streamable HTTP or SSE) is called as given."""
    out = []
    for server in servers:
        if server["transport"] != "stdio":
            out.append(MCPServerConfig(name=server["name"], url=server["url"], sse=server["transport"] == "sse"))
            continue
        if shutil.which("docker") is None:
            raise EnvError(f"the task's MCP server {server['name']!r} runs in its container through the docker CLI, "
                           "which is not on PATH: install it (Debian: apt-get install docker.io)")
        docker_env = {k: v for k, v in os.environ.items() if k.startswith("DOCKER_")}  # the SDK passes no others
        if docker_host:
            docker_env["DOCKER_HOST"] = docker_host
        out.append(MCPServerConfig(name=server["name"], command="docker", env=docker_env,
                                   args=["exec", "-i", "-w", workdir, container, server["command"], *server["args"]]))
    return out


class RepoEnv(TextEnv):
    """Change a repository in a container until its tests pass.

    ## Description
    A task's repository (SWE-bench: ``/testbed`` at ``base_commit``, its later history
    removed; Harbor: the image's working directory) in a container with no network (unless a
    Harbor task allows it) and limits on CPU, memory, pids and disk. The model calls
    ``bash(command)``, ``str_replace_editor(command, path, ...)`` and ``submit()``.

    ## Action Space
    ``Text``: the assistant's reply, any Unicode string; its tool calls are read in
    ``tool_call_parser``'s format.

    ## Observation Space
    ``Messages``. Reset: the task's problem statement (``problem_statement`` or
    ``instruction.md``) and how to work. After a reply with calls: one ``role: tool`` message
    per call (a command's output, cut in the middle past ``max_output`` bytes, with its exit
    code, timeout or shell restart noted). Final step: ``[]``.

    ## Starting State
    ``options["task"]``: a SWE-bench row or ``{"task_dir": path}``; else a row of
    ``dataset`` drawn with the seeded ``np_random``. The container comes from a warm pool; a
    row's ``files`` are written into it and committed then (``envs/repo/tasks.py``).

    ## Rewards
    ``resolved`` (weight 1): the ``score`` fact — SWE-bench: 1.0 when swebench's grading says
    resolved (every FAIL_TO_PASS test fixed, every PASS_TO_PASS kept); Harbor: the verifier's
    reward. ``f2p_fixed`` and ``p2p_kept`` (weights ``f2p_weight``, ``p2p_weight``, default 0):
    the shares of FAIL_TO_PASS tests fixed and PASS_TO_PASS tests kept. ``ran_tests`` (weight
    0, reported only): 1.0 when a ``bash`` command matching ``test_pattern`` ran before grading.

    ## Episode End
    Terminated by ``submit`` or a reply without tool calls (graded then). Truncated after
    ``max_turns`` replies (graded on the last one), or by ``max_tokens`` / ``max_wall_s`` (not
    graded: score 0).

    ## Information
    Reset: ``tools`` (the OpenAI schemas, MCP servers' included), ``task_id``, ``format``. Step: ``turn``,
    ``commands``, ``tool_errors``; on the graded step ``score``, ``resolved``, ``ran_tests``, ``f2p_fixed``,
    ``p2p_kept``, ``patch_applied``, ``diff`` (SWE-bench), ``verifier_exit`` (Harbor), and
    ``rewards`` on the last step (the grading's time and log, not deterministic, are the env's
    ``last_grade``). A failure of the
    container or engine raises ``SandboxError`` (the episode failed; it is not a grade).

    ## Arguments
    ``dataset`` (JSONL/Parquet of SWE-bench rows, a Harbor task dir or a folder of them),
    ``max_turns`` (50), ``command_timeout_s`` (60), ``max_output`` (10000 bytes),
    ``eval_timeout_s`` (1800, SWE-bench's eval script), ``cpus`` (1), ``memory_mb`` (2048),
    ``pids`` (256), ``disk_mb`` (4096) — Harbor tasks' own task.toml values win —,
    ``strip_git_history`` (True), ``tools`` (names of ``TOOLS``), ``extra_tools`` (functions or
    ``Tool``s added to the ToolBox), ``mcp_servers`` (entries of
    ``agentrl.env.mcp_tools.MCPServerConfig``: their tools beside these in every episode;
    a Harbor task's own servers join for its episodes), ``f2p_weight``, ``p2p_weight``,
    ``warm`` (1 idle container per image), ``docker_host``, ``sandbox`` (URLs of ``agentrl sandbox serve``, a list or
    comma-separated, as a run's ``sandbox.services`` gives them: the containers run there, each
    episode on the least busy; a lost host fails its episodes with ``SandboxError``; key from
    ``AGENTRL_SANDBOX_API_KEY``. Empty or "docker": the engine of ``docker_host``), ``tool_call_parser``, ``reasoning_parser``, ``max_tokens``,
    ``max_wall_s``, ``render_mode``: "ansi" or None, ``prompt`` (the first message, a template
    of ``{instruction}`` and ``{workdir}``; default ``PROMPT``; a short one for small contexts),
    ``test_pattern`` (a regular expression: the bash commands that count as running tests),
    ``tool_descriptions`` (tool name -> the description offered instead of its docstring's; short
    ones for small contexts), ``short_edits`` (False; True: an edit of ``str_replace_editor``
    answers with the edited lines alone, numbered, instead of a snippet around them and advice),
    ``editor_commands`` (the ``str_replace_editor`` commands offered; all by default; fewer: a
    shorter schema, e.g. ``[str_replace]`` for small contexts; another command is refused).

    ## Version History
    * v0: initial version.
    """

    def __init__(
        self,
        dataset: str | Path | None = None,
        max_turns: int = 50,
        command_timeout_s: float = 60.0,
        max_output: int = 10_000,
        eval_timeout_s: float = 1800.0,
        cpus: float = 1.0,
        memory_mb: int = 2048,
        pids: int = 256,
        disk_mb: int = 4096,
        strip_git_history: bool = True,
        tools: Sequence[str] = TOOLS,
        extra_tools: Sequence[Callable[..., Any] | Tool] = (),
        mcp_servers: Sequence[Mapping[str, Any] | MCPServerConfig] = (),
        f2p_weight: float = 0.0,
        p2p_weight: float = 0.0,
        warm: int = 1,
        docker_host: str = "",
        sandbox: str | Sequence[str] = "",
        tool_call_parser: str = DEFAULT_TOOL_PARSER,
        reasoning_parser: str | None = None,
        max_tokens: int | None = None,
        max_wall_s: float | None = None,
        render_mode: str | None = None,
        prompt: str = PROMPT,
        test_pattern: str = TEST_PATTERN,
        tool_descriptions: Mapping[str, str] | None = None,
        short_edits: bool = False,
        editor_commands: Sequence[str] = COMMANDS,
    ) -> None:
        super().__init__(
            rubric=Rubric([Reward("resolved", fact("score")), Reward("f2p_fixed", fact("f2p_fixed"), f2p_weight),
                           Reward("p2p_kept", fact("p2p_kept"), p2p_weight), Reward("ran_tests", fact("ran_tests"), 0.0)]),
            limits=EpisodeLimits(max_turns=max_turns, max_tokens=max_tokens, max_wall_s=max_wall_s),
            render_mode=render_mode,
        )
        if set(tools) - set(TOOLS):
            raise EnvError(f"tools must name tools of {TOOLS}, got {list(tools)}")
        described = dict(tool_descriptions or {})
        if set(described) - set(tools):
            raise EnvError(f"tool_descriptions must name offered tools ({list(tools)}), got {sorted(described)}")
        if command_timeout_s <= 0 or eval_timeout_s <= 0:
            raise EnvError(f"command_timeout_s and eval_timeout_s must be > 0, got {command_timeout_s}, {eval_timeout_s}")
        if "{instruction}" not in prompt:
            raise EnvError(f"prompt must contain {{instruction}} (the task's text), got {prompt[:80]!r}")
        try:
            self.test_pattern = re.compile(test_pattern)
        except re.error as e:
            raise EnvError(f"test_pattern must be a regular expression, got {test_pattern!r} ({e})") from e
        self.prompt, self.short_edits, self.editor_commands = prompt, short_edits, tuple(editor_commands)
        self.dataset = str(dataset) if dataset is not None else None
        self.command_timeout_s, self.eval_timeout_s = command_timeout_s, eval_timeout_s
        self.strip_git_history = strip_git_history
        self.base_spec = ContainerSpec(image="", cpus=cpus, memory_mb=memory_mb, pids=pids, disk_mb=disk_mb)
        self.pool_config = RepoPoolConfig(docker_host=docker_host, warm=warm, max_output=max_output)
        self.sandbox_services = _services(sandbox)
        offered = {"bash": self.bash, "str_replace_editor": self.str_replace_editor, "submit": self.submit}
        own = [replace(tool(offered[name]), description=described[name]) if name in described else tool(offered[name])
               for name in TOOLS if name in tools]
        own = [replace(t, parameters=offered_parameters(t.parameters, self.editor_commands))
               if t.name == "str_replace_editor" else t for t in own]
        self.toolbox = ToolBox(own + list(extra_tools),
                               timeout_s=command_timeout_s + 120, max_result_chars=max_output + 200,
                               tool_call_parser=tool_call_parser, reasoning_parser=reasoning_parser,
                               sources=mcp_sources(mcp_servers))
        self.repo_task: RepoTask | None = None
        self.session: RepoSession | RemoteRepoSession | None = None
        self._editor: FileEditor | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._submitted = self._tested = False
        self._commands = self._errors = 0
        self.last_grade: dict[str, Any] = {}
        """The last grading's ``grade_s`` (seconds) and ``grade_log`` (the tests' output, its tail)."""

    @property
    def pool(self) -> RepoPool | RepoFleet:
        if self.sandbox_services:  # the containers run on sandbox services, spread over them
            return shared_repo_fleet(self.sandbox_services, warm=self.pool_config.warm,
                                     max_output=self.pool_config.max_output)
        return shared_repo_pool(self.pool_config)

    # ---------------------------------------------------------------- the tools

    async def bash(self, command: str) -> str:
        """Run one bash command in the repository's container; the working directory and
        environment variables persist between calls. Output is cut in the middle when long.

        Args:
            command: the command line to run (one command; chain with && or ;).
        """
        self._commands += 1
        self._tested = self._tested or bool(self.test_pattern.search(command))
        result = await self._live().bash(command, self.command_timeout_s)
        return result.text()

    async def str_replace_editor(self, command: Command, path: str, file_text: str | None = None,
                                 old_str: str | None = None, new_str: str | None = None,
                                 insert_line: int | None = None, view_range: list[int] | None = None) -> str:
        """View, create and edit files: `view` a file (with line numbers) or directory, `create`
        a new file, `str_replace` an exact unique string, `insert` after a line, `undo_edit`.

        Args:
            command: one of view, create, str_replace, insert, undo_edit.
            path: absolute path of the file or directory.
            file_text: content of the file to create (create).
            old_str: the exact text to replace, occurring once in the file (str_replace).
            new_str: the replacement (str_replace) or the text to insert (insert).
            insert_line: the line after which new_str is inserted; 0 for the top (insert).
            view_range: [start, end] lines to show, end -1 for the rest of the file (view).
        """
        self._live()
        assert self._editor is not None
        return await self._editor(command, path, file_text, old_str, new_str, insert_line, view_range)

    def submit(self) -> str:
        """Submit the current state of the repository as the solution; the episode ends."""
        self._submitted = True
        return "Submitted. The repository will now be graded by its tests."

    def _live(self) -> RepoSession | RemoteRepoSession:
        if self.session is None:
            raise EnvError("no episode is running: reset the env first")
        return self.session

    # ---------------------------------------------------------------- episode

    def sample_task(self) -> dict[str, Any]:
        if self.dataset is None:
            raise EnvError("agentrl/Repo-v0 has no default tasks: pass dataset=... or reset(options={'task': row})")
        return self.pick(_rows(self.dataset))

    async def _start(self, task: dict[str, Any]) -> list[Message]:
        pool = self.pool
        self.repo_task = await pool.in_thread(read_task, task, self.base_spec, strip_history=self.strip_git_history,
                                              build_image=pool.build_image)
        self._submitted, self._tested, self._commands, self._errors = False, False, 0, 0
        self._stack = contextlib.AsyncExitStack()
        self.session = await self._stack.enter_async_context(pool.episode(self.repo_task.spec))
        await place_files(self.session, self.repo_task)
        self._editor = FileEditor(self.session, short=self.short_edits, commands=self.editor_commands)
        if self.repo_task.mcp_servers:  # the Harbor task's own servers, for this episode
            await self.toolbox.add_episode_sources(mcp_sources(self._task_servers()))
        self.start_facts = {"task_id": self.repo_task.task_id, "format": self.repo_task.kind}
        text = self.prompt.format(instruction=self.repo_task.instruction.strip(), workdir=self.session.workdir)
        return [{"role": "user", "content": text}]

    def _task_servers(self) -> list[MCPServerConfig]:
        task, session = self.repo_task, self._live()
        assert task is not None
        if not isinstance(session, RepoSession):
            if any(s["transport"] == "stdio" for s in task.mcp_servers):
                raise EnvError(f"Harbor task {task.task_id!r} declares stdio MCP servers, which run inside the "
                               "episode's container through docker exec; episodes on sandbox services cannot do "
                               "that yet: run this task on the local engine (sandbox: docker)")
            return harbor_mcp_configs(task.mcp_servers, container="", workdir="", docker_host="")
        return harbor_mcp_configs(task.mcp_servers, container=session.box.container.id, workdir=session.workdir,
                                  docker_host=self.pool_config.docker_host)

    async def _turn(self, action: str) -> Turn:
        assert self.toolbox is not None
        handled = await self.toolbox.handle(action, turn=self._turns)
        self._errors += handled.num_errors
        facts: dict[str, Any] = {"commands": self._commands, "tool_errors": self._errors}
        finished = self._submitted or not handled.attempted
        if finished or self._turns >= self.limits.max_turns:
            facts["ran_tests"] = float(self._tested)
            facts.update(await self.grade())
            self.last_grade = {k: facts.pop(k) for k in ("grade_s", "grade_log") if k in facts}  # not deterministic
        return Turn([] if finished else handled.messages, done=finished, facts=facts)

    async def grade(self) -> dict[str, Any]:
        """Grade the repository as it is now (see ``envs/repo/grading.py``)."""
        task, session = self.repo_task, self._live()
        assert task is not None
        if task.kind == "harbor":
            facts = await grade_harbor(session, task)
            return {**facts, "score": float(facts["reward"])}
        diff = await agent_diff(session, task)
        facts = await grade_swebench(self.pool, task, diff, self.eval_timeout_s)
        return {**facts, "diff": diff, "score": float(facts["resolved"])}

    async def _end(self) -> None:
        stack, self._stack, self.session, self._editor = self._stack, None, None, None
        if stack is not None:
            await stack.aclose()

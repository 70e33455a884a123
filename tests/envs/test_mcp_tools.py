"""Tools from real MCP servers as env tools: the protocol's own test server
(``@modelcontextprotocol/server-everything``, ``make mcp-servers``) over stdio and over
streamable HTTP, ``mcp-server-git`` on a repository made here, and a FastMCP server of our own.

The bug stories: a server error, a hung call or a dead server that crashes the training step
instead of telling the model; a per-episode server that leaks into the next episode; images
that flood the context; a server's schema that the model reads with noise it was not trained on.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from agentrl.env.mcp_tools import MCPServerConfig, offer_schema, result_text
from agentrl.env.tools import ToolFailed
from agentrl.errors import ConfigError, ToolError
from agentrl.process.services import ServiceProcess, free_port
from envs.tool_use import ToolUseEnv

ROOT = Path(__file__).resolve().parents[2]
EVERYTHING = ROOT / ".mcp-servers/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
MCP_GIT = ROOT / ".venv-mcp-git/bin/mcp-server-git"
HTTP_READY = "MCP Streamable HTTP Server listening on port "
LOOPBACK = Path(__file__).with_name("node_loopback.cjs")  # it listens on every interface unless told a host
TOOLS = ["echo", "get-sum", "get-tiny-image", "get-structured-content", "trigger-long-running-operation",
         "get-resource-links"]


@pytest.fixture(scope="module")
def everything() -> Path:
    if not EVERYTHING.is_file():
        pytest.fail(f"{EVERYTHING} is missing; run `make mcp-servers`")
    return EVERYTHING


@pytest.fixture(scope="module")
def everything_http(everything):
    """server-everything over streamable HTTP on a free port of 127.0.0.1 (it takes only a PORT
    and listens on every interface; ``node_loopback.cjs`` gives its listen call the host)."""
    port = free_port()
    with ServiceProcess(http_command(everything), ready=HTTP_READY, startup_timeout=30,
                        env={**os.environ, "PORT": str(port)}) as proc:
        assert {c.laddr.ip for c in psutil.Process(proc.proc.pid).net_connections("tcp") if c.status == "LISTEN"} \
            == {"127.0.0.1"}
        yield f"http://127.0.0.1:{port}/mcp", proc


def http_command(everything: Path) -> list[str]:
    return ["node", "--require", str(LOOPBACK), str(everything), "streamableHttp"]


def call(name: str, args: dict) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": args})}</tool_call>'


def env_with(server: dict, **kwargs) -> ToolUseEnv:
    return ToolUseEnv(kinds=["calc"], tools=[], max_turns=8, mcp_servers=[server], **kwargs)


def server_processes(marker: str) -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if marker in " ".join(p.cmdline())]


async def play_everything(env: ToolUseEnv) -> list[str]:
    """One turn with a call of every kind: a text answer, a bad argument (checked here), an
    image, structured content, a call past its timeout and an argument the server refuses."""
    _, info = await env.areset(seed=0)
    assert [t["function"]["name"] for t in info["tools"]] == TOOLS  # the filter, in its order
    summed = next(t["function"] for t in info["tools"] if t["function"]["name"] == "get-sum")
    assert summed["parameters"] == {"type": "object", "required": ["a", "b"], "properties": {
        "a": {"type": "number", "description": "First number"}, "b": {"type": "number", "description": "Second number"}}}
    reply = "".join([call("echo", {"message": "hi"}), call("get-sum", {"a": 2, "b": "x"}), call("get-tiny-image", {}),
                     call("get-structured-content", {"location": "Chicago"}),
                     call("trigger-long-running-operation", {"duration": 5, "steps": 5}),
                     call("get-resource-links", {"count": 0})])
    obs, reward, terminated, truncated, info = await env.astep(reply)
    assert not terminated and not truncated and info["tool_calls"] == 6 and info["tool_errors"] == 3
    return [m["content"] for m in obs]


def check_everything_answers(contents: list[str]) -> None:
    echo, bad, image, structured, slow, refused = contents
    assert echo == "Echo: hi"
    assert bad == 'error: argument \'b\' of get-sum: expected a JSON number, got "x"'
    assert image.splitlines()[1].startswith("[image/png image, ") and image.splitlines()[1].endswith(" bytes, not shown]")
    assert set(json.loads(structured)) == {"temperature", "conditions", "humidity"}
    assert slow == "error: trigger-long-running-operation did not finish within 1 s"
    assert refused.startswith("error: get-resource-links failed: ") and "count" in refused


async def test_server_everything_over_stdio_a_fresh_server_each_episode_and_a_crash_is_a_tool_error(everything):
    env = env_with({"name": "everything", "command": "node", "args": [str(everything), "stdio"], "tools": TOOLS,
                    "call_timeout_s": 1.0})
    try:
        check_everything_answers(await play_everything(env))
        [first] = server_processes(str(everything))
        first.kill()  # the server crashes between two calls of one episode
        obs, _, terminated, _, info = await env.astep(call("echo", {"message": "again"}))
        assert not terminated and info["tool_errors"] == 4
        assert obs[0]["content"].startswith("error: echo failed: the MCP server 'everything' ")
        obs, _, terminated, _, _ = await env.astep("The answer is \\boxed{1}.")
        assert terminated and obs == []
        await env.areset(seed=1)  # the next episode gets a server of its own
        [second] = server_processes(str(everything))
        assert second.pid != first.pid
        obs, *_ = await env.astep(call("echo", {"message": "back"}))
        assert obs[0]["content"] == "Echo: back"
        await env.astep("\\boxed{2}")
        assert server_processes(str(everything)) == []  # closed when its episode ended
    finally:
        await env.aclose()


async def test_server_everything_over_streamable_http_shared_by_the_workers_envs(everything_http):
    url, proc = everything_http
    server = {"name": "everything", "url": url, "tools": TOOLS, "call_timeout_s": 1.0, "scope": "worker"}
    a, *others = [env_with(server) for _ in range(6)]
    try:
        check_everything_answers(await play_everything(a))
        await asyncio.gather(*(env.areset(seed=0) for env in others))  # a batch of episodes starting at once
        assert {id(env.toolbox.sources[0]._conn) for env in others} == {id(a.toolbox.sources[0]._conn)}
        obs, *_ = await others[0].astep(call("echo", {"message": "shared"}) + call("echo", {"message": "x" * 5000}))
        assert obs[0]["content"] == "Echo: shared"
        assert obs[1]["content"] == "Echo: " + "x" * 3994 + "... [1006 more characters cut]"  # the env's bound
    finally:
        for env in (a, *others):
            await env.aclose()


async def test_a_dead_http_server_is_a_tool_error_and_a_missing_one_fails_the_reset(everything):
    port = free_port()
    cmd, env_vars = http_command(everything), {**os.environ, "PORT": str(port)}
    server = {"name": "everything", "url": f"http://127.0.0.1:{port}/mcp", "tools": ["echo"], "call_timeout_s": 2.0,
              "connect_timeout_s": 5.0}
    env = env_with(server)
    try:
        with ServiceProcess(cmd, ready=HTTP_READY, startup_timeout=30, env=env_vars):
            await env.areset(seed=0)
        obs, _, terminated, _, info = await env.astep(call("echo", {"message": "anyone?"}))
        assert not terminated and info["tool_errors"] == 1 and obs[0]["content"].startswith("error: echo ")
        with pytest.raises(ToolError, match="MCP server 'everything' could not start"):
            await env.areset(seed=1)  # no server at the URL: the episode cannot begin (failed data)
    finally:
        await env.aclose()


@pytest.fixture
def repo(tmp_path) -> Path:
    """A repository with one commit and an unstaged change."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "notes.txt").write_text("hello\n")
    subprocess.run([*git, "add", "notes.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first notes"], check=True)
    (repo / "notes.txt").write_text("hello\nworld\n")
    return repo


async def test_mcp_server_git_on_a_repository_made_here(repo, tmp_path):
    if not MCP_GIT.is_file():
        pytest.fail(f"{MCP_GIT} is missing; run `make mcp-servers`")
    env = env_with({"name": "git", "command": str(MCP_GIT), "args": ["--repository", str(repo)],
                    "tools": ["git_log", "git_diff_unstaged"]})
    try:
        _, info = await env.areset(seed=0)
        assert {t["function"]["name"] for t in info["tools"]} == {"git_log", "git_diff_unstaged"}
        obs, *_ = await env.astep(call("git_log", {"repo_path": str(repo)})
                                  + call("git_diff_unstaged", {"repo_path": str(repo)})
                                  + call("git_log", {"repo_path": str(tmp_path / "elsewhere")}))
        log, diff, outside = (m["content"] for m in obs)
        assert "first notes" in log and "+world" in diff
        assert outside.startswith("error: git_log failed: ")  # outside the repository it serves
    finally:
        await env.aclose()


FASTMCP_SERVER = '''
import os, sys
from mcp.server.fastmcp import FastMCP

mcp = FastMCP("ours")

@mcp.tool()
def word_count(text: str) -> int:
    """Count the words of a text."""
    return len(text.split())

@mcp.tool()
def divide(a: int, b: int) -> float:
    """Divide a by b."""
    return a / b

@mcp.tool()
def crash() -> str:
    """Stop the server at once."""
    os._exit(3)

mcp.run()
'''


async def test_a_fastmcp_server_of_our_own_structured_results_errors_and_a_crash(tmp_path):
    script = tmp_path / "server.py"
    script.write_text(FASTMCP_SERVER)
    env = env_with({"name": "ours", "command": sys.executable, "args": [str(script)], "prefix": "ours_"})
    try:
        _, info = await env.areset(seed=0)
        [count] = [t["function"] for t in info["tools"] if t["function"]["name"] == "ours_word_count"]
        assert count == {"name": "ours_word_count", "description": "Count the words of a text.", "parameters": {
            "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}  # no titles
        obs, *_ = await env.astep(call("ours_word_count", {"text": "one two three"}) + call("ours_divide", {"a": 1, "b": 0})
                                  + call("ours_crash", {}) + call("ours_word_count", {"text": "after"}))
        counted, divided, crashed, after = (m["content"] for m in obs)
        assert counted == "3" and divided.startswith("error: ours_divide failed: ") and "division by zero" in divided
        assert crashed.startswith("error: ours_crash failed: the MCP server 'ours' ")
        assert after.startswith("error: ours_word_count failed: the MCP server 'ours' is down")
    finally:
        await env.aclose()


async def test_a_fastmcp_server_over_the_older_http_sse_transport(tmp_path):
    """Harbor's default MCP transport (and many servers' still): a GET event stream and POSTs."""
    script = tmp_path / "server.py"
    script.write_text(FASTMCP_SERVER.replace("mcp.run()", 'mcp.settings.port = int(os.environ["PORT"])\nmcp.run("sse")'))
    port = free_port()
    with ServiceProcess([sys.executable, str(script)], ready="INFO:     Uvicorn running on ", startup_timeout=60,
                        env={**os.environ, "PORT": str(port)}):
        env = env_with({"name": "ours", "url": f"http://127.0.0.1:{port}/sse", "sse": True, "tools": ["word_count"]})
        try:
            _, info = await env.areset(seed=0)
            assert [t["function"]["name"] for t in info["tools"]] == ["word_count"]
            obs, *_ = await env.astep(call("word_count", {"text": "over the event stream"}))
            assert obs[0]["content"] == "4"
        finally:
            await env.aclose()


def test_the_tool_turn_of_each_kind_of_content_and_the_offered_schema():
    from mcp import types

    image = types.ImageContent(type="image", data="A" * 400, mimeType="image/png")
    blob = types.EmbeddedResource(type="resource", resource=types.BlobResourceContents(
        uri="file:///x.bin", blob="AAAA", mimeType="application/octet-stream"))
    text = types.EmbeddedResource(type="resource", resource=types.TextResourceContents(uri="file:///a.txt", text="abc"))
    link = types.ResourceLink(type="resource_link", uri="file:///b.md", name="b", mimeType="text/markdown")
    result = types.CallToolResult(content=[types.TextContent(type="text", text="hi"), image, blob, text, link])
    assert result_text(result).splitlines() == [
        "hi", "[image/png image, 300 bytes, not shown]", "[application/octet-stream resource file:///x.bin, not shown]",
        "abc", "[resource link: file:///b.md (text/markdown)]"]
    assert result_text(types.CallToolResult(content=[], structuredContent={"n": 1})) == '{"n": 1}'
    with pytest.raises(ToolFailed, match="^no such file$"):
        result_text(types.CallToolResult(content=[types.TextContent(type="text", text="no such file")], isError=True))
    assert offer_schema({"$schema": "x", "title": "T", "properties": {"a": {"title": "A", "type": "integer"}},
                         "additionalProperties": False}) == {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": [], "additionalProperties": False}
    with pytest.raises(ConfigError, match="either command .* or url"):
        MCPServerConfig(name="x")
    with pytest.raises(ConfigError, match="did you mean"):
        MCPServerConfig.of({"name": "x", "comand": "node"})
    with pytest.raises(ConfigError, match="scope"):
        MCPServerConfig(name="x", url="http://127.0.0.1:1/mcp", scope="process")
    with pytest.raises(ConfigError, match="sse is a url's transport"):
        MCPServerConfig(name="x", command="node", sse=True)


async def test_a_call_an_agent_runs_outside_its_replies_counts_as_the_envs_own():
    """What the gateway's MCP endpoint calls (``TextEnv.call_tool``): ToolUse counts it, and an
    answer that copies its result is credited as a tool's (``used_tool_result``)."""
    env = ToolUseEnv(kinds=["calc"])
    await env.areset(options={"task": {"question": "What is 37*48?", "answer": "1776"}})
    assert await env.call_tool("calculator", {"expression": "37*48"}) == ("1776", True)
    assert (await env.call_tool("calculator", {"expr": "1"}))[1] is False
    _, reward, terminated, _, info = await env.astep("\\boxed{1776}")
    assert terminated and reward == 1.0 and info["used_tool_result"] and (info["tool_calls"], info["tool_errors"]) == (2, 1)


async def test_the_mcp_calculator_offers_the_prompt_the_tiny_model_was_trained_on():
    """examples/mcp_calculator.py (FastMCP) as examples/tool_agent_mcp.yaml configures it: the
    offered tool is the Python calculator's to the byte, and its answers are the same."""
    import yaml

    from agentrl.model.arith_data import CALCULATOR_TOOL

    config = yaml.safe_load((ROOT / "examples" / "tool_agent_mcp.yaml").read_text())
    kwargs = config["rollout"]["workflow_args"]["env_kwargs"]
    [server] = kwargs["mcp_servers"]
    env = ToolUseEnv(**{**kwargs, "mcp_servers": [{**server, "args": [str(ROOT / a) for a in server["args"]]}]})
    try:
        _, info = await env.areset(options={"task": {"question": "What is 37*48?", "answer": "1776"}})
        assert json.dumps(info["tools"]) == json.dumps([CALCULATOR_TOOL])
        obs, *_ = await env.astep(call("calculator", {"expression": "37*48"}) + call("calculator", {"expression": "x"}))
        assert obs[0]["content"] == "1776" and obs[1]["content"].startswith("error: calculator failed: ")
    finally:
        await env.aclose()

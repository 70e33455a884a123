"""agentrl/Repo-v0 with real Docker: a real package's repository (six 1.17.0 with a bug put in,
docker/repo-task/build.py) in containers of its own image, graded by swebench's own grading
and by a Harbor verifier; the persistent shell; what an agent must not be able to do.

The image and both task formats come from one session fixture (`make repo-images` builds them
before the suite; cached), and every test shares the process's warm pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import gymnasium
import psutil
import pytest

import docker as docker_sdk
import envs  # noqa: F401  (registers the ids)
from agentrl.env.checks import check_text_env
from agentrl.env.tools import tool
from agentrl.errors import EnvError, SandboxError
from envs.repo.editor import FileEditor
from envs.repo.env import RepoEnv, harbor_mcp_configs
from envs.repo.tasks import harbor_task
from sandboxes.repo_container import LABEL, ContainerSpec
from sandboxes.repo_pool import RepoPool, RepoPoolConfig, shared_repo_pool
from sandboxes.repo_remote import RemoteRepoSession

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def repo_tasks(docker_ready):
    """The folder with instances.jsonl and harbor/six-ensure-text (built once, cached)."""
    out = subprocess.run([sys.executable, str(REPO / "docker/repo-task/build.py")], capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr
    return Path(out.stdout.strip())


@pytest.fixture(scope="session")
def row(repo_tasks):
    return json.loads((repo_tasks / "instances.jsonl").read_text())


@pytest.fixture(scope="session")
def harbor_dir(repo_tasks):
    return repo_tasks / "harbor" / "six-ensure-text"


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def apply(patch: str) -> str:
    return call("bash", command=f"git apply - <<'EOF_PATCH'\n{patch}EOF_PATCH")


async def play(task: dict, replies: list[str], **kwargs) -> tuple[float, dict, list[str]]:
    """One episode of scripted replies: (last reward, last info + its container's id, the tool outputs seen)."""
    env = gymnasium.make("agentrl/Repo-v0", **{"max_turns": 10, "command_timeout_s": 20, **kwargs}).unwrapped
    seen: list[str] = []
    try:
        await env.areset(options={"task": task})
        container_id = env.session.box.container.id
        for reply in replies:
            obs, reward, terminated, truncated, info = await env.astep(reply)
            seen += [m["content"] for m in obs]
            if terminated or truncated:
                break
        return reward, {**info, "container_id": container_id}, seen
    finally:
        await env.aclose()


def container_exists(container_id: str) -> bool:
    with contextlib.closing(docker_sdk.from_env()) as client:
        try:
            client.containers.get(container_id)
            return True
        except docker_sdk.errors.NotFound:
            return False


# --------------------------------------------------------------------------- grading


async def test_swebench_gold_resolves_empty_and_breaking_patches_do_not(row):
    break_b = call("bash", command="""sed -i '649s/"latin-1"/"utf-8"/' six.py && sed -n 648,649p six.py""")
    (gold, gold_info, _), (empty, empty_info, _), (broken, broken_info, seen) = await asyncio.gather(
        play(row, [apply(row["patch"]), call("submit")]),
        play(row, ["I cannot fix this."], f2p_weight=0.5, p2p_weight=0.25),
        play(row, [apply(row["patch"]), break_b, call("submit")]))  # the fix, and six.b broken
    assert (gold, gold_info["resolved"], gold_info["f2p_fixed"], gold_info["p2p_kept"]) == (1.0, True, 1.0, 1.0)
    assert "ensure_text" in gold_info["diff"] and "test_six.py" not in gold_info["diff"]
    assert gold_info["rewards"] == {"resolved": 1.0, "f2p_fixed": 1.0, "p2p_kept": 1.0, "ran_tests": 0.0}  # the shares weigh 0 by default
    assert (empty_info["resolved"], empty_info["f2p_fixed"], empty_info["p2p_kept"]) == (False, 0.0, 1.0)
    assert empty == 0.25  # the shares' weights are configurable: 0.5 * 0.0 + 0.25 * 1.0
    assert 'return s.encode("utf-8")' in seen[-1]
    assert (broken, broken_info["resolved"], broken_info["f2p_fixed"]) == (0.0, False, 1.0)
    assert broken_info["p2p_kept"] == pytest.approx(0.8)  # test_b of five fails


async def test_harbor_solution_passes_and_a_noop_fails(harbor_dir, row, tmp_path):
    task = {"task_dir": str(harbor_dir)}
    solve = (harbor_dir / "solution" / "solve.sh").read_text()
    built = tmp_path / "six-from-dockerfile"  # the same task with an environment/Dockerfile instead of docker_image
    shutil.copytree(harbor_dir, built)
    toml = (built / "task.toml").read_text()
    (built / "task.toml").write_text("\n".join(line for line in toml.splitlines() if "docker_image" not in line))
    (built / "environment").mkdir()
    (built / "environment" / "Dockerfile").write_text(f"FROM {row['image']}\nWORKDIR /testbed\n")
    solve_replies = [call("bash", command=f"bash <<'EOF_SOLVE'\n{solve}EOF_SOLVE"), call("submit")]
    (solved, solved_info, seen), (noop, noop_info, _), (from_dockerfile, _, _) = await asyncio.gather(
        play(task, [call("bash", command="ls /tests /logs/verifier 2>&1 | head -2"), *solve_replies]),
        # a reward written beforehand does not count: the verifier's folder is emptied before it runs
        play(task, [call("bash", command="mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt"), "done"]),
        play({"task_dir": str(built)}, solve_replies))  # its image is built once, tagged by the folder's hash
    assert "No such file or directory" in seen[0]  # the verifier's tests are not in the container before grading
    assert (solved, solved_info["resolved"], solved_info["verifier_exit"]) == (1.0, True, 0)
    assert (noop, noop_info["resolved"]) == (0.0, False) and "grade_error" not in noop_info
    assert from_dockerfile == 1.0
    with contextlib.closing(docker_sdk.from_env()) as client:
        assert any(t.startswith("agentrl-harbor-six-from-dockerfile:") for i in client.images.list() for t in i.tags)


# --------------------------------------------------------------------------- a Harbor task's MCP servers

# An MCP server of the standard library alone (the task image has no `mcp` package and no network):
# newline-delimited JSON-RPC on stdin/stdout, one tool that says where it runs.
WHERE_SERVER = """
import json, os, socket, sys
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, reply = msg["method"], {"jsonrpc": "2.0", "id": msg["id"]}
    if method == "initialize":
        reply["result"] = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                           "serverInfo": {"name": "where", "version": "1"}}
    elif method == "tools/list":
        reply["result"] = {"tools": [{"name": "where", "description": "Where this server runs.",
                                      "inputSchema": {"type": "object", "properties": {}}}]}
    elif method == "tools/call":
        reply["result"] = {"content": [{"type": "text", "text": socket.gethostname() + " " + os.getcwd()}]}
    else:
        reply["error"] = {"code": -32601, "message": "no method " + method}
    print(json.dumps(reply), flush=True)
"""


async def test_a_harbor_tasks_stdio_mcp_server_runs_in_the_episodes_container_beside_bash(harbor_dir, tmp_path):
    """Harbor hands a task's [[environment.mcp_servers]] to an agent inside the task's container:
    the stdio server runs there (docker exec), its tool is offered beside bash, the editor and
    the run's own MCP servers (``mcp_servers``: the example's calculator, on this machine)."""
    task_dir = tmp_path / "six-with-mcp"
    shutil.copytree(harbor_dir, task_dir)
    with (task_dir / "task.toml").open("a") as f:
        f.write('\n[[environment.mcp_servers]]\nname = "where"\ntransport = "stdio"\ncommand = "python3"\n'
                f"args = [\"-c\", '''{WHERE_SERVER}''']\n")
    calculator = {"name": "calculator", "command": "python", "args": [str(REPO / "examples" / "mcp_calculator.py")]}
    env = gymnasium.make("agentrl/Repo-v0", command_timeout_s=20, mcp_servers=[calculator]).unwrapped
    try:
        _, info = await env.areset(options={"task": {"task_dir": str(task_dir)}})
        assert [t["function"]["name"] for t in info["tools"]] == ["bash", "str_replace_editor", "submit", "calculator",
                                                                  "where"]
        [server] = [p for p in psutil.Process().children() if p.cmdline()[:2] == ["docker", "exec"]]
        assert env.session.box.container.id in server.cmdline()
        obs, _, terminated, _, _ = await env.astep(call("where") + call("bash", command="echo $(hostname) $(pwd)")
                                                   + call("calculator", expression="6*7"))
        where, shell, product = (m["content"] for m in obs)
        assert not terminated and where == shell.splitlines()[0] == "repo /testbed" and product == "42"
        await env.astep("done")  # graded; the episode's servers end with it
        assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE
    finally:
        await env.aclose()


def write_harbor_task(folder: Path, servers: str) -> Path:
    folder.mkdir()
    (folder / "instruction.md").write_text("Do it.\n")
    (folder / "tests").mkdir()
    (folder / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (folder / "task.toml").write_text(f'[environment]\ndocker_image = "img"\n{servers}')
    return folder


HARBOR_SERVERS = """
[[environment.mcp_servers]]
name = "files"
transport = "stdio"
command = "mcp-files"
args = ["--root", "/app"]

[[environment.mcp_servers]]
name = "search"
url = "http://search.internal:8000/sse"

[[environment.mcp_servers]]
name = "api"
transport = "streamable-http"
url = "https://api.example.com/mcp"
"""
BAD_HARBOR_SERVERS = {
    'name = "x"\ntransport = "stdio"\ncommand = "c"\nenv = {A = "1"}': "unknown field(s) ['env']; Harbor's are",
    'name = "x"\ntransport = "websocket"\nurl = "ws://h/mcp"': "transport 'websocket' is not one of ['sse', ",
    'name = "x"\ntransport = "streamable-http"': "transport 'streamable-http' needs an http(s) url, got None",
    'name = "x"\ntransport = "stdio"': "transport 'stdio' needs a command",
    'name = "x"\nurl = "http://127.0.0.1:3847/mcp"': "is the task container's own loopback",
    'transport = "stdio"\ncommand = "c"': "needs a name",
}


def test_harbor_mcp_servers_are_read_as_harbor_defines_them_and_mapped_for_an_episode(tmp_path):
    task = harbor_task(write_harbor_task(tmp_path / "ok", HARBOR_SERVERS), ContainerSpec(image=""))
    files, search, api = harbor_mcp_configs(task.mcp_servers, container="c0ffee", workdir="/app",
                                            docker_host="tcp://127.0.0.1:2375")
    assert (files.command, files.args, files.env["DOCKER_HOST"]) == (
        "docker", ["exec", "-i", "-w", "/app", "c0ffee", "mcp-files", "--root", "/app"], "tcp://127.0.0.1:2375")
    assert (search.url, search.sse) == ("http://search.internal:8000/sse", True)  # Harbor's default transport
    assert (api.url, api.sse) == ("https://api.example.com/mcp", False)
    env = gymnasium.make("agentrl/Repo-v0").unwrapped  # an episode on a sandbox service: no docker exec there
    env.repo_task, env.session = task, RemoteRepoSession(host=None, session_id="s1", workdir="/app")
    with pytest.raises(EnvError, match=r"declares stdio MCP servers.*run this task on the local engine"):
        env._task_servers()
    env.repo_task.mcp_servers = task.mcp_servers[1:]  # URLs alone are called from here, wherever the container is
    assert [c.name for c in env._task_servers()] == ["search", "api"]
    env.session = None
    for i, (entry, message) in enumerate(BAD_HARBOR_SERVERS.items()):
        with pytest.raises(EnvError, match=re.escape(message)):
            harbor_task(write_harbor_task(tmp_path / f"bad{i}", f"[[environment.mcp_servers]]\n{entry}\n"),
                        ContainerSpec(image=""))


def test_the_editor_offered_with_fewer_commands_has_a_shorter_schema_and_refuses_the_others():
    full = gymnasium.make("agentrl/Repo-v0").unwrapped
    editor = tool(RepoEnv().str_replace_editor).parameters
    assert full.toolbox.tools["str_replace_editor"].parameters == editor  # by default: every command, as declared
    env = gymnasium.make("agentrl/Repo-v0", editor_commands=["str_replace"]).unwrapped
    params = env.toolbox.tools["str_replace_editor"].parameters
    assert list(params["properties"]) == ["command", "path", "old_str", "new_str"]
    assert params["properties"]["command"]["enum"] == ["str_replace"] and params["required"] == ["command", "path", "old_str"]
    assert params["properties"]["old_str"]["type"] == "string" and "default" not in params["properties"]["old_str"]
    assert params["properties"]["new_str"] == editor["properties"]["new_str"]  # optional: an empty new_str deletes
    env.session = RemoteRepoSession(host=None, session_id="s1", workdir="/testbed")
    env._editor = FileEditor(env.session, commands=env.editor_commands)  # as the reset builds it
    refused = asyncio.run(env.str_replace_editor("view", "/testbed"))
    assert refused.startswith("Unrecognized command view.") and refused.endswith("are: str_replace"), refused
    with pytest.raises(EnvError, match=r"editor commands must be some of \['view'"):
        gymnasium.make("agentrl/Repo-v0", editor_commands=["open"])


# --------------------------------------------------------------------------- the shell and the editor


async def test_persistent_shell_timeout_restart_and_output_cut(row):
    pool = shared_repo_pool(RepoPoolConfig(max_output=2000))
    async with pool.episode(ContainerSpec(image=row["image"], workdir="/testbed")) as s:
        container_id = s.box.container.id
        assert (await s.bash("cd /tmp && export GREETING=hi", 10)).exit_code == 0
        assert (await s.bash("pwd; echo $GREETING", 10)).output == "/tmp\nhi\n"
        slow = await s.bash("echo started; sleep 60", 1)
        assert slow.timed_out and not slow.restarted and slow.output.startswith("started")
        assert (await s.bash("pwd; echo $GREETING", 10)).output == "/tmp\nhi\n"  # the same shell
        spin = await s.bash("while :; do :; done", 1)  # a builtin loop: only a new shell stops it
        assert spin.timed_out and spin.restarted and "were reset" in spin.text()
        assert (await s.bash("pwd; echo \"[$GREETING]\"", 10)).output == "/testbed\n[]\n"
        ended = await s.bash("exit 3", 10)
        assert ended.restarted and (await s.bash("echo alive", 10)).output == "alive\n"
        failed = await s.bash("ls /nonexistent", 10)
        assert failed.exit_code == 2 and "No such file" in failed.output and "[exit code 2]" in failed.text()
        long = await s.bash("seq 1 200000", 10)
        assert len(long.output) < 2100 and long.output.startswith("1\n2\n") and long.output.endswith("199999\n200000\n")
        assert "bytes cut ...]" in long.output
        assert (await s.bash("cat", 5)).output == ""  # stdin is /dev/null: the next command is not eaten
    assert not container_exists(container_id)


async def test_editor_follows_str_replace_editor_semantics(row):
    async with shared_repo_pool().episode(ContainerSpec(image=row["image"], workdir="/testbed")) as s:
        edit = FileEditor(s)
        assert "/testbed/six.py" in await edit("view", "/testbed")
        assert "not an absolute path" in await edit("view", "six.py")
        view = await edit("view", "/testbed/six.py", view_range=[955, 956])
        assert view.splitlines()[1:] == ["   955\t    if isinstance(s, binary_type):",
                                         "   956\t        return s.decode('latin-1', errors)"]
        assert "File created successfully" in await edit("create", "/testbed/notes/a.txt", file_text="one\ntwo\n")
        assert "already exists" in await edit("create", "/testbed/notes/a.txt", file_text="x")
        assert "did not appear verbatim" in await edit("str_replace", "/testbed/notes/a.txt", old_str="three", new_str="3")
        assert "Multiple occurrences" in await edit("str_replace", "/testbed/six.py", old_str="return s", new_str="x")
        assert "has been edited" in await edit("str_replace", "/testbed/notes/a.txt", old_str="two", new_str="2")
        assert "has been edited" in await edit("insert", "/testbed/notes/a.txt", insert_line=0, new_str="zero")
        assert (await s.read_file("/testbed/notes/a.txt")) == b"zero\none\n2\n"
        assert "undone" in await edit("undo_edit", "/testbed/notes/a.txt")
        assert (await s.read_file("/testbed/notes/a.txt")) == b"one\n2\n"
        assert "No edit history" in await edit("undo_edit", "/testbed/six.py")
        assert "Invalid `insert_line`" in await edit("insert", "/testbed/notes/a.txt", insert_line=99, new_str="x")


# --------------------------------------------------------------------------- what the agent must not do


async def test_forbidden_actions_are_contained(row):
    cheat = "\n\n\ndef test_ensure_text_decodes_with_encoding():\n    pass\n"
    reward, info, seen = await play(row, [
        call("bash", command="git log --all --oneline | wc -l; git reflog | wc -l; git stash list | wc -l; "
                             "grep -rl test_ensure_text_decodes_with_encoding /testbed /tmp /root /home /opt /srv "
                             "2>/dev/null | wc -l"),
        call("bash", command="python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)\" 2>&1 "
                             "| tail -1"),
        call("bash", command=f"printf '{cheat}' >> test_six.py && git diff --stat | tail -1"),  # a test file edited
        call("bash", command=":(){ :|:& };:"),  # fork bomb: the pids limit holds it, the timeout kills it
        call("bash", command="echo after the bomb"),  # may still meet the bomb: it is killed at the timeout
        call("bash", command="echo after the bomb"),
        call("bash", command="echo after the bomb"),
        call("bash", command="echo after the bomb"),
        call("bash", command="echo after the bomb"),
        call("bash", command="nohup sleep 1000 >/dev/null 2>&1 & echo started"),
        call("submit")], command_timeout_s=3)
    assert seen[0].split() == ["1", "0", "0", "0"]  # one commit, no reflog or stash, the grading test nowhere
    assert "Network is unreachable" in seen[1]
    assert "1 file changed" in seen[2]
    # the episode goes on: the shell answers (on a loaded machine a bomb process killed late may
    # still have printed bash's "fork: retry" lines before it)
    assert seen[8].splitlines()[-1] == "after the bomb"  # five tries: CI met three killed in a row
    assert (reward, info["resolved"]) == (0.0, False) and "test_six.py" not in info["diff"]
    assert not container_exists(info["container_id"])  # the episode's container went, and the sleep in it
    with contextlib.closing(docker_sdk.from_env()) as client:  # what is left of this process's: the warm ones, idle
        mine = client.containers.list(all=True, filters={"label": f"{LABEL}.owner={shared_repo_pool().owner}"})
        assert len(mine) <= shared_repo_pool().config.max_warm


async def test_disk_fill_and_rm_rf_are_contained(row):
    pool = RepoPool(warm=0, disk_poll_s=0.2)
    spec = ContainerSpec(image=row["image"], workdir="/testbed", disk_mb=64)
    try:
        async with pool.episode(spec) as s:
            gone = await s.bash("rm -rf --no-preserve-root / 2>/dev/null; echo /testbed/*; ls", 20)
            assert gone.output.startswith("/testbed/*\n") and "ls: command not found" in gone.output
        async with pool.episode(spec) as s:  # the next episode's container is whole
            assert "six.py" in (await s.bash("ls", 10)).output
            with pytest.raises(SandboxError, match="disk limit"):
                await s.bash("dd if=/dev/zero of=/fill bs=1M count=4000; sleep 5", 30)
        assert pool.counters["disk_kills"] == 1
    finally:
        await pool.aclose()


KILLED_RUN = """
import asyncio, os, sys
from sandboxes.repo_container import ContainerSpec
from sandboxes.repo_pool import RepoPool
async def main():
    pool = RepoPool(warm=0)
    async with pool.episode(ContainerSpec(image=sys.argv[1], workdir="/testbed")) as s:
        print(s.box.container.id, flush=True)
        await asyncio.sleep(600)
asyncio.run(main())
"""


def test_a_killed_run_leaves_no_container(row):
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RUN, row["image"]], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    container_id = proc.stdout.readline().strip()
    assert container_exists(container_id)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert container_exists(container_id)  # SIGKILL ran no cleanup: the container is left behind
    pool = RepoPool(warm=0)
    client = pool._connect()  # a new pool's first engine call removes what dead owners left
    assert not container_exists(container_id)
    client.close()


# --------------------------------------------------------------------------- the env contract


def test_envs_check_passes_on_repository_tasks(row, harbor_dir, tmp_path):
    second = {**row, "instance_id": row["instance_id"] + "-copy", "problem_statement": "Fix six.ensure_text."}
    dataset = tmp_path / "tasks.jsonl"
    dataset.write_text(json.dumps(row) + "\n" + json.dumps(second) + "\n")
    assert check_text_env("agentrl/Repo-v0", {"dataset": str(dataset), "warm": 2}, seeds=(0, 1)) == []


def test_two_step_train_on_repository_tasks(row, tmp_path):
    """`agentrl train` on SWE-bench rows: the tiny model's replies play agentrl/Repo-v0 and are
    graded in fresh containers; no episode fails and every trajectory has its reward."""
    from ..short_runs import recorded_trajectories, short_train

    dataset = tmp_path / "instances.jsonl"
    dataset.write_text(json.dumps({**row, "problem_statement": "Fix six.ensure_text."}) + "\n")  # the tiny model
    short_train(tmp_path / "run", {  # reads 1024 tokens (bytes): a short statement, two tools
        "workflow": "workflows.env:EnvWorkflow",
        "workflow_args": {"env_id": "agentrl/Repo-v0", "max_context_tokens": 1024,
                          "env_kwargs": {"max_turns": 2, "command_timeout_s": 10, "tools": ["bash", "submit"]}},
        "dataset": str(dataset), "group_size": 2, "batch_size": 1, "max_concurrent": 2,
        "sampling": {"temperature": 1.0, "max_new_tokens": 16}})
    trajectories = recorded_trajectories(tmp_path / "run")
    assert trajectories and all(t["status"] == "ok" for t in trajectories)
    assert all(t["reward"] == 0.0 for t in trajectories)  # the untrained tiny model fixes nothing


# --------------------------------------------------------------------------- several hosts


def serve_sandbox(api_key: str, uid_base: int):
    """A real `agentrl sandbox serve` on 127.0.0.1 with a key: (process, url)."""
    from agentrl.process.services import ServiceProcess

    argv = [sys.executable, "-m", "agentrl.cli", "sandbox", "serve", "--backend", "local", "--port", "0",
            "--api-key", api_key, "--max-concurrency", "8", "--uid-base", str(uid_base)]
    service = ServiceProcess(argv, ready="agentrl sandbox serve: ready on ", startup_timeout=120, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    return service.proc, service.url


def owned_containers(pid: int) -> list[str]:
    import socket

    with contextlib.closing(docker_sdk.from_env()) as client:
        owner = f"{LABEL}.owner={socket.gethostname()}:{pid}"
        return [c.id for c in client.containers.list(all=True, filters={"label": owner})]


async def test_episodes_spread_over_two_sandbox_services_and_a_lost_host_fails_only_its_own(row, monkeypatch):
    import httpx

    from sandboxes.remote import RemoteSandbox

    key = "repo-key-" + os.urandom(4).hex()
    monkeypatch.setenv("AGENTRL_SANDBOX_API_KEY", key)
    (proc_a, url_a), (proc_b, url_b) = await asyncio.gather(asyncio.to_thread(serve_sandbox, key, 63700),
                                                            asyncio.to_thread(serve_sandbox, key, 63800))
    procs, probes = {url_a: proc_a, url_b: proc_b}, [RemoteSandbox(u, key) for u in (url_a, url_b)]
    envs_ = [gymnasium.make("agentrl/Repo-v0", max_turns=10, command_timeout_s=20, warm=0,
                            sandbox=f"{url_a},{url_b}").unwrapped for _ in range(3)]
    try:
        async with httpx.AsyncClient() as plain:  # every route needs the key
            spec = {"spec": {"image": row["image"]}}
            assert (await plain.post(f"{url_a}/repo/sessions", json=spec)).status_code == 401
            assert (await plain.post(f"{url_a}/repo/sessions/x/bash", json={"command": "id"})).status_code == 401
            keyed = {"Authorization": f"Bearer {key}"}
            big = {"spec": {"image": row["image"], "memory_mb": 1 << 20}}
            refused = await plain.post(f"{url_a}/repo/sessions", json=big, headers=keyed)
            assert refused.status_code == 422 and "max_memory_mb" in refused.json()["error"]["message"]
            gone = await plain.post(f"{url_a}/repo/sessions/x/bash", json={"command": "id"}, headers=keyed)
            assert gone.status_code == 404
        await asyncio.gather(*(e.areset(options={"task": row}) for e in envs_))
        hosts = [e.session.host.url for e in envs_]
        assert set(hosts) == {url_a, url_b}  # each host got some
        assert sorted([(await p.health())["sessions"] for p in probes]) == [1, 2]
        survivors = [e for e, h in zip(envs_, hosts, strict=True) if h != hosts[0]]
        lost = procs[hosts[0]]
        await envs_[0].astep(call("bash", command="cd /tmp && echo begun"))
        lost.kill()  # the host of the first episode is lost mid-episode
        lost.wait(timeout=30)
        with pytest.raises(SandboxError, match="was lost"):  # that episode fails (data), not the run
            await envs_[0].astep(call("bash", command="ls"))
        for env in survivors:  # the other host's episodes finish: the gold patch resolves through it
            obs, *_ = await env.astep(apply(row["patch"]))
            _, reward, terminated, _, info = await env.astep(call("submit"))
            assert (reward, terminated, info["resolved"]) == (1.0, True, True)
        kept_url = next(h for h in hosts if h != hosts[0])
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}) as keyed_client:
            opened = await keyed_client.post(f"{kept_url}/repo/sessions", json={"spec": {"image": row["image"]}},
                                             timeout=120)  # left open: the service's shutdown destroys it
            assert opened.status_code == 200 and opened.json()["workdir"]
    finally:
        for env in envs_:
            await env.aclose()
        for p in probes:
            await p.aclose()
        for proc in procs.values():
            proc.terminate()
            proc.wait(timeout=60)
    assert owned_containers(procs[kept_url].pid) == []  # all destroyed at close and at the service's shutdown
    RepoPool(warm=0)._connect().close()  # the lost host's containers: its owner is gone, the reaper removes them
    assert owned_containers(lost.pid) == []

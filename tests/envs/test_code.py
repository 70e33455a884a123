"""Code environments: program extraction, host-side grading (fake sandbox for the parsing
logic), and the real LocalSandbox for HumanEval, stdin/stdout tasks, cheating solutions and
the CodeAgent's persistent session."""

from __future__ import annotations

import asyncio
import json
import os

import gymnasium
import pytest

import envs  # noqa: F401
from agentrl import plugins
from agentrl.api import ExecRequest, ExecResult, ExecStatus
from agentrl.env.datasets import data_path, load_rows
from agentrl.errors import EnvError, SandboxError
from agentrl.model.tokenizer import tool_call_text
from envs.code.grading import count_tests, extract_code, grade, task_kind
from envs.code.harness import check_statements

HUMANEVAL = {r["task_id"]: r for r in load_rows(data_path("HumanEval.jsonl.gz"))}
H0 = HUMANEVAL["HumanEval/0"]
SUM_TASK = {"question": "Read two integers and print their sum.",
            "inputs": ["1 2\n", "10 -3\n", "7 7\n"], "outputs": ["3\n", "7\n", "14\n"]}


def fenced(code: str) -> str:
    return f"Here you go:\n```python\n{code}\n```\n"


# --------------------------------------------------------------------------- pure logic


def test_extract_code_takes_the_last_fenced_block():
    assert extract_code("```python\na = 1\n```\ntext\n```py\nb = 2\n```") == "b = 2\n"
    assert extract_code("```\nplain\n```") == "plain\n"
    assert extract_code("no code, just `inline`") is None
    assert extract_code("```python\nunclosed") is None


def test_task_kinds_and_test_counts():
    assert task_kind(H0) == "function" and count_tests(H0) == 7
    assert task_kind(SUM_TASK) == "stdio" and count_tests(SUM_TASK) == 3
    with pytest.raises(EnvError, match="HumanEval keys"):
        task_kind({"question": "x"})
    with pytest.raises(EnvError, match="equally long"):
        task_kind({"inputs": ["1"], "outputs": []})


def test_constant_asserts_are_setup_not_tests():
    source = "def check(c):\n    assert True, 'debug'\n    x = 1\n    assert c(x) == 2\n    for i in range(3):\n        assert c(i) >= 0\n"
    arg, statements = check_statements(source)
    assert arg == "c" and [i for i, _ in statements] == [None, None, 0, 1]
    with pytest.raises(ValueError, match="check"):
        check_statements("def other(c):\n    pass\n")


class ScriptedSandbox:
    """A fake Sandbox for the host-side parsing logic: it answers with lines built from the
    nonce it finds in the request (or a wrong one)."""

    def __init__(self, lines, status=ExecStatus.OK, use_nonce=True):
        self.lines, self.status, self.use_nonce = lines, status, use_nonce
        self.requests: list[ExecRequest] = []

    async def run(self, request: ExecRequest) -> ExecResult:
        self.requests.append(request)
        nonce = json.loads(request.stdin)["nonce"] if self.use_nonce else "0" * 32
        return ExecResult(status=self.status, stdout="".join(f"{nonce} {line}\n" for line in self.lines))

    def session(self):
        raise NotImplementedError


async def test_host_counts_only_tagged_distinct_in_range_passes():
    sb = ScriptedSandbox(["0 pass", "0 pass", "1 pass", "99 pass", "2 fail \"AssertionError: \"", "done"])
    g = await grade(sb, H0, "def has_close_elements(n, t):\n    return True\n")
    assert (g.passed, g.total, g.status) == (2, 7, "ok") and "test 2 failed" in g.feedback
    request = sb.requests[0]
    assert request.files["solution.py"].startswith("def has_close_elements")
    assert json.loads(request.stdin)["nonce"] not in request.code + "".join(request.files.values())
    first, second = ScriptedSandbox(["done"]), ScriptedSandbox(["done"])
    await grade(first, H0, "x = 1")
    await grade(second, H0, "x = 1")
    assert json.loads(first.requests[0].stdin)["nonce"] != json.loads(second.requests[0].stdin)["nonce"]


async def test_lines_without_the_runs_nonce_count_for_nothing():
    sb = ScriptedSandbox([f"{i} pass" for i in range(7)], use_nonce=False)
    assert (await grade(sb, H0, "x = 1")).passed == 0


async def test_a_failing_backend_is_an_error_not_a_grade():
    with pytest.raises(SandboxError):
        await grade(ScriptedSandbox([], status=ExecStatus.SANDBOX_ERROR), H0, "x = 1")
    assert (await grade(ScriptedSandbox([]), H0, None)).status == "no_code"


# --------------------------------------------------------------------------- the real sandbox

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="LocalSandbox builds its jail as root")


@pytest.fixture(scope="module")
def local_sandbox():
    sb = plugins.shared_sandbox("local")
    yield sb
    plugins.SHARED_SANDBOXES.pop("local", None)
    asyncio.run(sb.aclose())


def play(env_id, task, reply, **kwargs):
    env = gymnasium.make(env_id, **kwargs)
    try:
        env.reset(options={"task": task})
        return env.step(reply)
    finally:
        env.close()


@needs_root
@pytest.mark.parametrize("task_id", ["HumanEval/0", "HumanEval/32", "HumanEval/33", "HumanEval/38"])
def test_canonical_humaneval_solutions_pass(local_sandbox, task_id):
    row = HUMANEVAL[task_id]
    _, reward, terminated, _, info = play("agentrl/Code-v0", row, fenced(row["prompt"] + row["canonical_solution"]))
    assert (reward, terminated, info["all_passed"], info["run_status"]) == (1.0, True, True, "ok")


CHEATS = {
    "exit at import": "import os\nos._exit(0)\n",
    "exit in the call": "import os\ndef has_close_elements(numbers, threshold):\n    os._exit(0)\n",
    "sys.exit": "import sys\nsys.exit(0)\n",
    "kill the harness": "import os, signal\ndef has_close_elements(numbers, threshold):\n"
                        "    os.kill(os.getppid(), signal.SIGKILL)\n",
    "patched builtins": "import builtins\nbuiltins.AssertionError = type('Never', (Exception,), {})\n"
                        "builtins.print = lambda *a, **k: None\n"
                        "def has_close_elements(numbers, threshold):\n    return None\n",
    "equals everything": "class Any:\n    def __eq__(self, other): return True\n    def __bool__(self): return True\n"
                         "def has_close_elements(numbers, threshold):\n    return Any()\n",
    "int subclass": "class Yes(int):\n    def __eq__(self, other): return True\n"
                    "def has_close_elements(numbers, threshold):\n    return Yes(1)\n",
    "pickle that runs code in the harness": (
        "class Evil:\n    def __reduce__(self):\n"
        "        return (eval, (\"type('A', (), {'__eq__': lambda s, o: True})()\",))\n"
        "def has_close_elements(numbers, threshold):\n    return Evil()\n"),
    "prints pass lines": "import sys\nfor i in range(7):\n    print(i, 'pass')\n    sys.__stdout__.write(f'{i} pass\\n')\n"
                         "def has_close_elements(numbers, threshold):\n    return None\n",
    "reads the tests": "import glob\nfound = [open(p).read() for p in glob.glob('/work/**', recursive=True) if p.endswith('.py')]\n"
                       "assert not any('def check' in f for f in found), 'tests leaked'\n"
                       "def has_close_elements(numbers, threshold):\n    raise RuntimeError('no tests found')\n",
}


@needs_root
@pytest.mark.parametrize("name", sorted(CHEATS))
def test_cheating_solutions_earn_nothing(local_sandbox, name):
    _, reward, _, _, info = play("agentrl/Code-v0", H0, fenced(CHEATS[name]), reward_mode="fraction")
    assert (reward, info["tests_passed"]) == (0.0, 0), info


@needs_root
def test_nonce_thief_reading_the_harness_memory_earns_nothing(local_sandbox):
    thief = (
        "import os, re\nppid = os.getppid()\nnonces = set()\n"
        "try:\n    mem = open(f'/proc/{ppid}/mem', 'rb', 0)\n"
        "    for line in open(f'/proc/{ppid}/maps'):\n"
        "        lo, hi = (int(x, 16) for x in line.split()[0].split('-'))\n"
        "        if line.split()[1].startswith('rw') and hi - lo < (64 << 20):\n"
        "            try:\n                mem.seek(lo); nonces.update(re.findall(rb'[0-9a-f]{32}', mem.read(hi - lo)))\n"
        "            except OSError:\n                pass\nexcept OSError:\n    pass\n"
        "for n in nonces:\n    for target in (f'/proc/{ppid}/fd/1', '/proc/self/fd/1'):\n"
        "        try:\n            with open(target, 'w') as f:\n"
        "                f.write(''.join(f'{n.decode()} {i} pass\\n' for i in range(7)))\n"
        "        except OSError:\n            pass\n"
        "def has_close_elements(numbers, threshold):\n    return None\n"
    )
    _, reward, _, _, info = play("agentrl/Code-v0", H0, fenced(thief), reward_mode="fraction")
    assert (reward, info["tests_passed"]) == (0.0, 0)


@needs_root
def test_partial_credit_and_timeouts(local_sandbox):
    always_true = "def has_close_elements(numbers, threshold):\n    return True\n"
    _, reward, *_, info = play("agentrl/Code-v0", H0, fenced(always_true), reward_mode="fraction")
    assert info["tests_passed"] == 4 and reward == pytest.approx(4 / 7)
    assert play("agentrl/Code-v0", H0, fenced(always_true))[1] == 0.0  # "all" mode
    spin = "def has_close_elements(numbers, threshold):\n    while True:\n        pass\n"
    *_, info = play("agentrl/Code-v0", H0, fenced(spin), time_limit_s=2.0)
    assert info["tests_passed"] == 0 and "ran out of time" in info["feedback"]


@needs_root
def test_stdin_stdout_tasks(local_sandbox):
    good = "a, b = map(int, input().split())\nprint(a + b)\n"
    _, reward, *_, info = play("agentrl/Code-v0", SUM_TASK, fenced(good))
    assert (reward, info["tests_passed"], info["tests_total"]) == (1.0, 3, 3)
    hardcoded = "print(3)\n"  # right for the first input only, computed nothing
    _, reward, *_, info = play("agentrl/Code-v0", SUM_TASK, fenced(hardcoded), reward_mode="fraction")
    assert info["tests_passed"] == 1 and reward == pytest.approx(1 / 3)
    assert play("agentrl/Code-v0", SUM_TASK, fenced(hardcoded))[1] == 0.0
    silent = "import os\nos._exit(0)\n"  # a clean exit code is not a pass
    assert play("agentrl/Code-v0", SUM_TASK, fenced(silent))[4]["tests_passed"] == 0
    crash_after = "a, b = map(int, input().split())\nprint(a + b)\nraise SystemExit(1)\n"
    assert play("agentrl/Code-v0", SUM_TASK, fenced(crash_after))[4]["tests_passed"] == 0
    assert play("agentrl/Code-v0", SUM_TASK, "no code here")[4]["run_status"] == "no_code"


@needs_root
def test_code_agent_session_persists_within_an_episode_only(local_sandbox):
    env = gymnasium.make("agentrl/CodeAgent-v0", max_turns=4)
    _, info = env.reset(options={"task": SUM_TASK})
    assert [t["function"]["name"] for t in info["tools"]] == ["python"]
    obs, *_ = env.step(tool_call_text("python", {"code": "x = 21"}))
    assert obs[0]["content"] == "[no output]"
    obs, reward, terminated, truncated, info = env.step(tool_call_text("python", {"code": "print(x * 2)"}))
    assert obs[0]["content"] == "42" and not terminated and info["tool_calls"] == 2
    _, reward, terminated, _, info = env.step(fenced("a, b = map(int, input().split())\nprint(a + b)"))
    assert (reward, terminated, info["all_passed"]) == (1.0, True, True)
    env.reset(options={"task": SUM_TASK})
    obs, *_ = env.step(tool_call_text("python", {"code": "print(x)"}))
    assert "NameError" in obs[0]["content"]  # a new episode, a new session
    env.close()


@needs_root
def test_tool_use_runs_code_blocks_and_rewards_only_the_right_answer(local_sandbox):
    """examples/code_docker.yaml's env: ToolUse-v0 with a sandbox and no tool. A code block runs
    and what it printed is the next turn; the reward is the right answer (a program earns nothing);
    used_tool_result counts a program's whole output, never a failed one's; without a sandbox
    the same reply is the final answer."""
    task = {"question": "What is 37*48?", "answer": "1776"}
    env = gymnasium.make("agentrl/ToolUse-v0", kinds=["calc"], tools=[], sandbox="local", max_turns=3)
    obs, info = env.reset(options={"task": task})
    assert info["tools"] == [] and obs == [{"role": "user", "content": "What is 37*48?"}]
    obs, reward, terminated, _, info = env.step(fenced("print(37*48)"))
    assert obs == [{"role": "tool", "content": "1776"}] and (reward, terminated, info["programs"]) == (0.0, False, 1)
    _, reward, terminated, _, info = env.step("\\boxed{1776}")
    assert (reward, terminated) == (1.0, True)
    assert info["rewards"] == {"correct": 1.0, "tool_errors": 0.0, "used_tool_result": 1.0, "programs": 1.0}
    env.reset(options={"task": task})  # a failing program: its error is shown, it is no result to use
    obs, *_ = env.step(fenced("print(37*48)\nprint(1776 // 0)"))
    assert obs[0]["content"].startswith("1776\n") and "[stderr]" in obs[0]["content"]
    assert "ZeroDivisionError" in obs[0]["content"] and obs[0]["content"].endswith("[status: runtime_error]")
    _, reward, _, _, info = env.step("\\boxed{1776}")
    assert reward == 1.0 and info["rewards"]["used_tool_result"] == 0.0
    env.reset(options={"task": task})  # programs alone never end the episode, nor earn
    for _ in range(3):
        obs, reward, terminated, truncated, info = env.step(fenced("print(1776)"))
    assert (reward, terminated, truncated, info["programs"]) == (0.0, False, True, 3)
    env.close()
    env = gymnasium.make("agentrl/ToolUse-v0", kinds=["calc"], tools=[])
    env.reset(options={"task": task})
    _, reward, terminated, _, info = env.step(fenced("print(37*48)"))
    assert (reward, terminated, "programs" in info["rewards"]) == (0.0, True, False)
    env.close()
    with pytest.raises(EnvError, match="tools must name tools of"):
        gymnasium.make("agentrl/ToolUse-v0", tools=["python"])


# --------------------------------------------------------------------------- other backends


@pytest.fixture(scope="module")
def docker_sandbox(docker_ready):
    """A small DockerSandbox; skipped without an engine and image unless CI is set."""
    from sandboxes.docker import DockerSandbox

    sandbox = DockerSandbox(pool_size=1, memory_mb=384)
    asyncio.run(sandbox.start())
    yield sandbox
    asyncio.run(sandbox.aclose())


@pytest.mark.docker
def test_grading_holds_on_the_docker_backend(docker_sandbox):
    async def run(task, code):
        return await grade(docker_sandbox, task, code)

    canonical = asyncio.run(run(H0, H0["prompt"] + H0["canonical_solution"]))
    assert (canonical.passed, canonical.total) == (7, 7)
    for name in ("exit at import", "pickle that runs code in the harness", "prints pass lines"):
        assert asyncio.run(run(H0, CHEATS[name])).passed == 0, name
    good = asyncio.run(run(SUM_TASK, "a, b = map(int, input().split())\nprint(a + b)\n"))
    assert good.passed == 3
    assert asyncio.run(run(SUM_TASK, "print(3)\n")).passed == 1

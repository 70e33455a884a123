"""Grading code on the host: extract the program, run the task's tests in a sandbox, count passes.

What it is: ``extract_code`` (the last fenced code block of a reply) and ``grade`` for the
two row formats the code environments accept:

* function tasks (HumanEval): ``{"prompt", "entry_point", "test"}`` — the tests run under
  envs/code/harness.py, which prints one nonce-tagged line per passing test; the nonce is
  fresh per run (``secrets``) and the number of tests is counted here, from the test code;
* stdin/stdout tasks: ``{"inputs": [...], "outputs": [...]}`` — one sandbox run per input,
  its stdout compared here with the expected output (trailing whitespace ignored).

A program's exit code never counts as a pass. What it is not: a sandbox — everything runs
through ``agentrl.api.Sandbox``; a failure of the sandbox itself raises ``SandboxError`` (the
episode failed; the program is not to blame), while the program's own failures (crash,
timeout, memory) are grades of 0 for the tests they hit.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.api import ExecRequest, ExecResult, ExecStatus, Sandbox
from agentrl.errors import EnvError, SandboxError
from envs.code.harness import check_statements

HARNESS_SOURCE = (Path(__file__).parent / "harness.py").read_text()
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str | None:
    """The body of the last fenced code block (```python ... ```) in ``text``, or None."""
    blocks = _FENCE.findall(text)
    return blocks[-1][1] if blocks else None


def task_kind(task: dict[str, Any]) -> str:
    """``"function"`` or ``"stdio"``; raises EnvError naming the expected keys otherwise."""
    if all(isinstance(task.get(k), str) for k in ("prompt", "entry_point", "test")):
        return "function"
    inputs, outputs = task.get("inputs"), task.get("outputs")
    if isinstance(inputs, list) and isinstance(outputs, list):
        if not inputs or len(inputs) != len(outputs) or not all(isinstance(s, str) for s in inputs + outputs):
            raise EnvError("a stdin/stdout task needs equally long, non-empty lists of strings "
                           f"'inputs' and 'outputs'; got {len(inputs)} inputs, {len(outputs)} outputs")
        return "stdio"
    raise EnvError("a code task needs either HumanEval keys 'prompt', 'entry_point', 'test' (strings) or "
                   f"stdin/stdout keys 'inputs', 'outputs' (lists of strings); got keys {sorted(task)}")


def count_tests(task: dict[str, Any]) -> int:
    """How many tests the task has (the denominator of the pass fraction)."""
    if task_kind(task) == "stdio":
        return len(task["inputs"])
    try:
        return sum(i is not None for i, _ in check_statements(task["test"])[1])
    except (SyntaxError, ValueError) as e:
        raise EnvError(f"the task's test code cannot be read: {e}") from e


@dataclass
class Grade:
    """How a program did: ``passed`` of ``total`` tests; ``status`` is the worst sandbox
    status seen (or ``no_code`` / ``load_error``); ``feedback`` a short text for the model."""

    passed: int
    total: int
    status: str
    feedback: str = ""

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    def facts(self) -> dict[str, Any]:
        return {"tests_passed": self.passed, "tests_total": self.total, "pass_fraction": self.fraction,
                "all_passed": self.total > 0 and self.passed == self.total, "run_status": self.status}


async def grade(
    sandbox: Sandbox,
    task: dict[str, Any],
    code: str | None,
    *,
    time_limit_s: float = 10.0,
    memory_limit_mb: int = 512,
    max_parallel: int = 4,
) -> Grade:
    """Run ``code`` against the task's tests in ``sandbox`` and count the passes on the host."""
    total = count_tests(task)
    if code is None or not code.strip():
        return Grade(0, total, "no_code", "No code found: put the program in a ```python code block.")
    if task_kind(task) == "function":
        return await _grade_function(sandbox, task, code, total, time_limit_s, memory_limit_mb)
    return await _grade_stdio(sandbox, task, code, time_limit_s, memory_limit_mb, max_parallel)


def _check_backend(result: ExecResult) -> None:
    if result.status is ExecStatus.SANDBOX_ERROR:
        raise SandboxError(f"the sandbox failed while grading: {result.error or result.stderr[-300:]}")


async def _grade_function(sandbox: Sandbox, task: dict[str, Any], code: str, total: int,
                          time_limit_s: float, memory_limit_mb: int) -> Grade:
    nonce = secrets.token_hex(16)
    spec = {"nonce": nonce, "prompt": task["prompt"], "test": task["test"],
            "entry_point": task["entry_point"], "budget_s": max(0.5, time_limit_s - 1.0)}
    result = await sandbox.run(ExecRequest(
        code=HARNESS_SOURCE, stdin=json.dumps(spec), files={"prompt.py": task["prompt"], "solution.py": code},
        time_limit_s=time_limit_s, memory_limit_mb=memory_limit_mb, output_limit_bytes=1 << 20,
    ))
    _check_backend(result)
    passed: set[int] = set()
    notes: list[str] = []
    for line in result.stdout.splitlines():
        tag, _, rest = line.partition(" ")
        if tag != nonce:
            continue
        key, _, tail = rest.partition(" ")
        verdict, _, detail = tail.partition(" ")
        if key.isdigit() and int(key) < total and tail == "pass":
            passed.add(int(key))
        elif key == "load_error":
            return Grade(0, total, "load_error", f"The code did not load: {_text(tail)}")
        elif key.isdigit() and verdict == "fail" and len(notes) < 3:
            notes.append(f"test {key} failed: {_text(detail)}")
        elif key == "setup_error":
            notes.append(f"the tests could not continue: {_text(tail)}")
    status = result.status.value
    if result.status is not ExecStatus.OK:
        notes.append(f"the test run ended with status {status}")
    feedback = f"{len(passed)}/{total} tests passed." + ("" if not notes else " " + "; ".join(notes))
    return Grade(len(passed), total, status, feedback)


def _text(field: str) -> str:
    try:
        return str(json.loads(field))
    except ValueError:
        return field


def _same_output(got: str, expected: str) -> bool:
    def norm(s: str) -> list[str]:
        return [line.rstrip() for line in s.strip().splitlines()]

    return norm(got) == norm(expected)


async def _grade_stdio(sandbox: Sandbox, task: dict[str, Any], code: str, time_limit_s: float,
                       memory_limit_mb: int, max_parallel: int) -> Grade:
    gate = asyncio.Semaphore(max_parallel)

    async def one(stdin: str) -> ExecResult:
        async with gate:
            return await sandbox.run(ExecRequest(code=code, stdin=stdin, time_limit_s=time_limit_s,
                                                 memory_limit_mb=memory_limit_mb))

    results = await asyncio.gather(*(one(s) for s in task["inputs"]))
    for r in results:
        _check_backend(r)
    ok = [r.status is ExecStatus.OK and _same_output(r.stdout, want)
          for r, want in zip(results, task["outputs"], strict=True)]
    worst = next((r.status.value for r in results if r.status is not ExecStatus.OK), "ok")
    first_bad = next((i for i, good in enumerate(ok) if not good), None)
    feedback = f"{sum(ok)}/{len(ok)} tests passed."
    if first_bad is not None:
        r = results[first_bad]
        detail = r.stderr.strip()[-300:] if r.status is not ExecStatus.OK else "wrong output"
        feedback += f" Test {first_bad} failed ({r.status.value}): {detail}"
    return Grade(sum(ok), len(ok), worst, feedback)

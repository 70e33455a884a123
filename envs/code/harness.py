"""The test harness that runs *inside* the sandbox for function-call tasks (HumanEval style).

What it is: a standalone stdlib-only program (its source is sent as the sandbox program;
the host also imports it for ``check_statements``). The harness forks: the *child* loads the
candidate's code and only answers calls (``candidate(*args)``) over a pipe; the *parent*
runs the task's tests, with ``candidate`` a proxy that forwards each call to the child, and
prints one line per test, tagged with a nonce the host generated: ``<nonce> <i> pass``.
The host grades from those lines alone (envs/code/grading.py); the exit code means nothing.

What is covered:
  * the candidate exits early (``os._exit(0)``, ``sys.exit``), crashes or hangs: its calls
    fail, no ``pass`` line is printed for the tests that needed them;
  * it patches ``assert``-related builtins, ``print``, ``sys.stdout`` or the test helpers:
    it does so in the child, while the tests run in the parent;
  * it returns an object that claims to equal anything (``__eq__`` always True) or a
    subclass of a builtin: results come back through an unpickler that refuses every class,
    so only plain builtin values (numbers, strings, containers, None) arrive;
  * it prints fake ``pass`` lines: the child's stdout/stderr are /dev/null, it never sees
    the nonce (read from stdin by the parent after the fork, after the child dropped fd 0),
    and the parent is made non-dumpable so ``/proc/<parent>/{mem,fd}`` are closed to it;
  * it reads the tests to look up expected answers: they reach the parent through stdin
    after the fork, and never exist as files in the jail.

What is not covered: a candidate with kernel-level tricks the jail does not stop (see
sandboxes/jail.py), and a candidate that kills the parent — which only makes it fail.
"""

import ast
import builtins
import io
import json
import os
import pickle
import select
import struct
import sys
import time

MAX_MESSAGE = 16 << 20  # bytes a child's reply may have


def check_statements(test_source):
    """(argument name of ``check``, [(index or None, statement)]) for a HumanEval test.

    Each top-level statement of ``check``'s body that holds an ``assert`` whose condition is
    not a constant is a test (numbered from 0); the other statements are setup. ``assert
    True, "..."`` lines are setup too: they would hand out credit for nothing.
    """
    tree = ast.parse(test_source)
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not checks or not checks[-1].args.args:
        raise ValueError("the test code must define check(candidate)")
    check = checks[-1]
    out, index = [], 0
    for stmt in check.body:
        asserts = [n for n in ast.walk(stmt) if isinstance(n, ast.Assert)]
        if any(not isinstance(a.test, ast.Constant) for a in asserts):
            out.append((index, stmt))
            index += 1
        else:
            out.append((None, stmt))
    return check.args.args[0].arg, out


# --------------------------------------------------------------------------- framing


def _send(fd, data):
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def _read_exact(fd, n, deadline):
    buf = b""
    while len(buf) < n:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and (left <= 0 or not select.select([fd], [], [], left)[0]):
            raise TimeoutError
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def _recv(fd, deadline=None):
    (n,) = struct.unpack(">I", _read_exact(fd, 4, deadline))
    if n > MAX_MESSAGE:
        raise ValueError(f"reply of {n} bytes is over the {MAX_MESSAGE} limit")
    return _read_exact(fd, n, deadline)


class _PlainValues(pickle.Unpickler):
    """Unpickles only plain builtin values: any class lookup is refused."""

    def find_class(self, module, name):
        if (module, name) in (("builtins", "complex"), ("builtins", "set"), ("builtins", "frozenset")):
            return getattr(builtins, name)
        raise pickle.UnpicklingError(f"the candidate returned a {module}.{name}; only plain values count")


# --------------------------------------------------------------------------- the child


def _child(go_r, req_r, rep_w):
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    keep = {0, 1, 2, go_r, req_r, rep_w}
    for fd in range(3, 256):
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    entry_point = _recv(go_r).decode()
    ns = {"__name__": "solution", "__builtins__": builtins}
    try:
        for name in ("prompt.py", "solution.py"):
            with open(name) as f:
                exec(compile(f.read(), name, "exec"), ns)
        fn = ns[entry_point]
        if not callable(fn):
            raise TypeError(f"{entry_point} is not a function")
    except BaseException as e:
        _send(rep_w, pickle.dumps(("load_error", f"{type(e).__name__}: {e}"[:400])))
        os._exit(0)
    _send(rep_w, pickle.dumps(("ready", None)))
    while True:
        args, kwargs = pickle.loads(_recv(req_r))
        try:
            reply = ("ok", fn(*args, **kwargs))
        except BaseException as e:
            reply = ("raise", type(e).__name__, str(e)[:300])
        try:
            data = pickle.dumps(reply)
        except Exception as e:
            data = pickle.dumps(("raise", "TypeError", f"the result cannot be sent back: {e}"[:300]))
        _send(rep_w, data)


# --------------------------------------------------------------------------- the parent


class CandidateFailed(Exception):
    """The candidate could not answer a call (it died, hung, or returned a non-plain value)."""


def _make_proxy(req_w, rep_r, deadline):
    state = {"dead": None}

    def candidate(*args, **kwargs):
        if state["dead"]:
            raise CandidateFailed(state["dead"])
        try:
            _send(req_w, pickle.dumps((args, kwargs)))
            reply = _PlainValues(io.BytesIO(_recv(rep_r, deadline))).load()
        except TimeoutError:
            state["dead"] = "the candidate ran out of time"
            raise CandidateFailed(state["dead"]) from None
        except (EOFError, OSError):
            state["dead"] = "the candidate process exited"
            raise CandidateFailed(state["dead"]) from None
        except (pickle.UnpicklingError, ValueError) as e:
            raise CandidateFailed(str(e)) from None
        if reply[0] == "ok":
            return reply[1]
        exc_type = getattr(builtins, str(reply[1]), None)
        if isinstance(exc_type, type) and issubclass(exc_type, Exception):
            raise exc_type(reply[2])
        raise CandidateFailed(f"{reply[1]}: {reply[2]}")

    return candidate


def _nondumpable():
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except Exception:
        pass


def main():
    _nondumpable()
    go_r, go_w = os.pipe()
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            _child(go_r, req_r, rep_w)
        finally:
            os._exit(0)
    for fd in (go_r, req_r, rep_w):
        os.close(fd)
    spec = json.loads(sys.stdin.read())
    os.close(0)
    nonce = spec["nonce"]
    deadline = time.monotonic() + float(spec["budget_s"])

    def say(*parts):
        sys.stdout.write(" ".join([nonce, *parts]) + "\n")
        sys.stdout.flush()

    _send(go_w, spec["entry_point"].encode())
    try:
        first = _PlainValues(io.BytesIO(_recv(rep_r, deadline))).load()
    except Exception as e:
        first = ("load_error", f"the candidate did not load ({type(e).__name__})")
    if first[0] != "ready":
        say("load_error", json.dumps(str(first[1])))
        say("done")
        return
    env = {"__name__": "tests", "__builtins__": builtins}
    candidate = _make_proxy(req_w, rep_r, deadline)
    try:
        exec(compile(spec["prompt"], "prompt.py", "exec"), env)
        # the tests may also name the function itself (HumanEval/33 does): that is the candidate too
        env[spec["entry_point"]] = candidate
        exec(compile(spec["test"], "test.py", "exec"), env)
        arg, statements = check_statements(spec["test"])
    except BaseException as e:
        say("setup_error", json.dumps(f"the task's own code failed: {type(e).__name__}: {e}"[:300]))
        say("done")
        return
    env[arg] = candidate
    for index, stmt in statements:
        code = compile(ast.Module(body=[stmt], type_ignores=[]), "check", "exec")
        try:
            exec(code, env)
        except BaseException as e:
            if index is None:
                say("setup_error", json.dumps(f"{type(e).__name__}: {e}"[:300]))
                break
            say(str(index), "fail", json.dumps(f"{type(e).__name__}: {e}"[:300]))
        else:
            if index is not None:
                say(str(index), "pass")
    say("done")


if __name__ == "__main__":
    main()

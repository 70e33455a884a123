"""The pythonic family (``pythonic``): a Python list of calls, ``[get_weather(city="Paris"), ...]``.

What it is: the parser SGLang and vLLM name ``pythonic`` (Llama 3.2 and 4, ToolACE). The
reply (or what follows the content before it) is one Python list whose items are calls with
keyword arguments; the arguments must be literals (strings, numbers, booleans, None, lists,
dicts). Llama 4's ``<|python_start|>``/``<|python_end|>`` around the list are dropped.
What it is not: an evaluator: the list is parsed with ``ast``, nothing is run.

Text that is not such a list is content; a list that starts like a call (``[name(``) but does
not parse, or holds a non-literal argument, is an error.
"""

from __future__ import annotations

import ast
import re

from agentrl.toolcalls.output import CallsFound, ToolCall, Tools, unknown_tool_error

MARKERS = ("<|python_start|>",)
EXAMPLE = '[tool_name(arg="value"), other_tool(n=1)]'
_START = re.compile(r"\[\s*[A-Za-z_]\w*\(")


def parse_calls(text: str, tools: Tools = None) -> CallsFound:
    stripped = text.replace("<|python_start|>", "").replace("<|python_end|>", "").strip()
    start = _START.search(stripped)
    if start is None:
        return CallsFound(stripped, [], [])
    before, source = stripped[: start.start()], stripped[start.start() :]
    tree, end, error = _first_list(source)
    if tree is None:
        return CallsFound(stripped, [], [f"tool calls are not a Python list of calls ({error}); write {EXAMPLE}"])
    if not all(isinstance(item, ast.Call) for item in tree.elts):
        return CallsFound(stripped, [], [])
    calls = []
    for item in tree.elts:
        call, error = _read_call(item, tools)
        if call is None:
            return CallsFound(stripped, [], [error])
        calls.append(call)
    return CallsFound((before.strip() + " " + source[end:].strip()).strip(), calls, [])


def _first_list(source: str) -> tuple[ast.List | None, int, str]:
    """The shortest prefix of ``source`` that is a Python list, and where it ends."""
    error = "no closing ]"
    end = source.find("]")
    while end != -1:
        try:
            tree = ast.parse(source[: end + 1], mode="eval").body
        except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
            error = str(e)
        else:
            if isinstance(tree, ast.List):
                return tree, end + 1, ""
        end = source.find("]", end + 1)
    return None, 0, error


def _read_call(item: ast.Call, tools: Tools) -> tuple[ToolCall | None, str]:
    if not isinstance(item.func, ast.Name):
        return None, f"a tool call must name its tool plainly; write {EXAMPLE}"
    name = item.func.id
    if item.args or any(k.arg is None for k in item.keywords):
        return None, f"the arguments of {name!r} must be keyword arguments; write {EXAMPLE}"
    try:
        args = {k.arg: _literal(k.value) for k in item.keywords}
    except ValueError as e:
        return None, f"the arguments of {name!r} must be literals ({e})"
    refused = unknown_tool_error(name, tools)
    return (None, refused) if refused else (ToolCall(name, args), "")


def _literal(node: ast.AST):
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (str, int, float, bool))):
        return node.value
    if isinstance(node, ast.List):
        return [_literal(v) for v in node.elts]
    if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) for k in node.keys):
        return {k.value: _literal(v) for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return -_literal(node.operand)
    raise ValueError(f"{ast.unparse(node)[:40]!r} is not a literal")

"""Integer arithmetic problems: the demo task family of the tiny model.

What it is: a seeded generator of problems such as ``What is 17+72+97?`` (answer 186), the
answer format ``\\boxed{N}`` and its extractor, the splits (a held-out share that keeps
evaluation and RL problems out of the supervised data, itself split into an evaluation pool
and an RL pool that never overlap), and the ``calculator`` tool (its OpenAI schema and a
safe evaluator) that tool-call traces and the tool-use environment share. Pure Python: it
imports neither torch nor transformers. What it is not: an environment (``envs/`` wraps it)
or a verifier of free-form math (``envs/math`` does that).

Main hooks::

    problems = generate_problems(1000, seed=0)                 # the evaluation pool
    prompts = generate_problems(1000, seed=0, split="rl")      # the RL pool: never overlaps it
    train = generate_problems(1000, seed=0, split="train")     # overlaps neither
    extract_answer(r"so \\boxed{186}") == 186

How the tiny model was trained to see a problem (match it to get its trained accuracy):
the user turn is ``problem.question`` alone, rendered by the tokenizer's chat template with
the generation prompt; the model answers ``\\boxed{N}<|end|>``. With ``tools=[CALCULATOR_TOOL]``
(and no system message) it was trained to answer by first calling
``calculator(expression=problem.expression)``, then, after the tool turn returns the result,
to answer ``\\boxed{N}``.
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

QUESTION_TEMPLATE = "What is {expression}?"
HELDOUT_PERCENT = 10  # share of all expressions reserved for evaluation and RL
EVAL_PERCENT = 50  # share of the held-out expressions reserved for evaluation (the rest: RL)
_MEMBERS = {"eval": ("eval",), "rl": ("rl",), "heldout": ("eval", "rl"), "train": ("train",),
            "all": ("eval", "rl", "train")}  # each split's pools (see split_of)
SPLITS = tuple(_MEMBERS)
MAX_MISSES = 100_000  # consecutive draws outside the split before generate_problems gives up
OPS = ("+", "-", "*")

CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an integer arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
MAX_EXPRESSION_CHARS = 200
MAX_RESULT_DIGITS = 30


@dataclass(frozen=True)
class ArithProblem:
    """One problem: the user-turn text, the integer answer and the bare expression."""

    question: str
    answer: int
    expression: str

    def to_row(self) -> dict[str, Any]:
        """A dataset row: ``{"question", "answer", "expression"}`` (answer as a string)."""
        return {"question": self.question, "answer": str(self.answer), "expression": self.expression}


def split_of(expression: str) -> str:
    """The pool ``expression`` belongs to: ``"train"``, ``"eval"`` or ``"rl"``.

    A fixed hash, the same on every machine and in every process: the first 8 bytes of the
    expression's SHA-256 put ``HELDOUT_PERCENT`` % of all expressions in the held-out share,
    the next 8 bytes put ``EVAL_PERCENT`` % of those in the evaluation pool and the rest in
    the RL pool (independent bits, so each pool is a uniform sample of the held-out share).
    """
    digest = hashlib.sha256(expression.encode()).digest()
    if int.from_bytes(digest[:8], "big") % 100 >= HELDOUT_PERCENT:
        return "train"
    return "eval" if int.from_bytes(digest[8:16], "big") % 100 < EVAL_PERCENT else "rl"


def is_heldout(expression: str) -> bool:
    """Whether ``expression`` is held out of supervised data (in the evaluation or the RL pool)."""
    return split_of(expression) != "train"


def generate_problems(
    n: int,
    seed: int,
    *,
    num_terms: tuple[int, ...] = (3,),
    max_operand: int = 99,
    ops: tuple[str, ...] = ("+",),
    split: str = "eval",
) -> list[ArithProblem]:
    """``n`` problems drawn from ``random.Random(seed)``: the same arguments give the same list.

    The defaults are the demo task: ``a+b+c`` with operands 0..99 (the tiny model's headline
    accuracy is measured on these; ``num_terms=(2,)`` is much easier for it).
    Each problem picks its number of terms uniformly from ``num_terms``, operands uniformly
    from 0..max_operand and each operator uniformly from ``ops``. ``split`` keeps only the
    expressions of one pool (``split_of``): ``"eval"`` (the default: problems to measure a
    model on), ``"rl"`` (prompts for RL, disjoint from ``"eval"``), ``"heldout"`` (both),
    ``"train"`` (supervised data; disjoint from both) or ``"all"``. Problems may repeat when
    the space is small (two terms under 100 hold ~500 expressions in each held-out pool).
    """
    _check_args(n, num_terms, max_operand, ops, split)
    below = _below(random.Random(seed))
    members = _MEMBERS[split]
    out: list[ArithProblem] = []
    misses = 0
    n_terms, n_ops, span = len(num_terms), len(ops), max_operand + 1
    while len(out) < n:
        k = num_terms[below(n_terms)]
        operands = [below(span) for _ in range(k)]
        operators = [ops[below(n_ops)] for _ in range(k - 1)]
        expression = str(operands[0]) + "".join(f"{o}{v}" for o, v in zip(operators, operands[1:], strict=True))
        if split_of(expression) not in members:
            misses += 1
            if misses > MAX_MISSES:
                raise ValueError(f"{MAX_MISSES} draws in a row fell outside split {split!r}: this problem space "
                                 "(num_terms, max_operand, ops) has (almost) no expressions in it; widen the "
                                 "space or use split='all'")
            continue
        misses = 0
        out.append(make_problem(expression))
    return out


def _below(rng: random.Random) -> Callable[[int], int]:
    """``rng.choice(seq)`` is ``seq[below(len(seq))]`` and ``rng.randint(0, m)`` is ``below(m + 1)``,
    the same draws from the same stream (``Random._randbelow``: rejection sampling on
    ``getrandbits``) at a third of the cost; a run's start builds 20,000 rows from ~400,000 draws."""
    bits = rng.getrandbits

    def below(n: int) -> int:
        k = n.bit_length()
        r = bits(k)
        while r >= n:
            r = bits(k)
        return r
    return below


def make_problem(expression: str) -> ArithProblem:
    """The problem for one expression (its answer computed by ``calculate``)."""
    return ArithProblem(QUESTION_TEMPLATE.format(expression=expression), int(calculate(expression)), expression)


def _check_args(n: int, num_terms: tuple[int, ...], max_operand: int, ops: tuple[str, ...], split: str) -> None:
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    if not num_terms or any(not isinstance(k, int) or k < 1 for k in num_terms):
        raise ValueError(f"num_terms must be a non-empty tuple of integers >= 1, got {num_terms!r}")
    if not isinstance(max_operand, int) or max_operand < 0:
        raise ValueError(f"max_operand must be an integer >= 0, got {max_operand!r}")
    if not ops or any(o not in OPS for o in ops):
        raise ValueError(f"ops must be a non-empty tuple drawn from {OPS}, got {ops!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


# --------------------------------------------------------------------------- answers


def format_answer(n: int) -> str:
    """The answer as the model writes it: ``\\boxed{N}``."""
    return f"\\boxed{{{int(n)}}}"


_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_INTEGER = re.compile(r"[+-]?\d+")


def extract_answer(text: str) -> int | None:
    """The integer in the last ``\\boxed{...}`` of ``text``; None if absent or not an integer.

    Only the last box counts (a model that writes several answers is judged on its final
    one). Spaces and thousands separators inside the box are ignored: ``\\boxed{ 1,024 }``.
    """
    boxes = _BOXED.findall(text)
    if not boxes:
        return None
    inner = boxes[-1].replace(",", "").replace(" ", "")
    return int(inner) if _INTEGER.fullmatch(inner) else None


# --------------------------------------------------------------------------- the calculator

_PARSE_LOCK = threading.Lock()
_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}


def calculate(expression: str) -> str:
    """Evaluate integer ``+ - *`` with parentheses and unary minus; the result as a string.

    The ``calculator`` tool. Raises ``ValueError`` with a message meant for the model to read
    for anything else (names, division, powers, calls, very long input or huge results).
    """
    if not isinstance(expression, str):
        raise ValueError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        with _PARSE_LOCK:  # CPython 3.11 < 3.11.8: ast.parse in two threads at once can raise SystemError
            tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(
            f"cannot parse {expression!r}; write integers with + - * and parentheses, e.g. 17+72*3"
        ) from None
    return str(_eval(tree.body))


def _eval(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        value = node.value
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _eval(node.operand)
        value = -inner if isinstance(node.op, ast.USub) else inner
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        value = _BINOPS[type(node.op)](_eval(node.left), _eval(node.right))
    else:
        raise ValueError("only integers, + - * and parentheses are allowed, e.g. 17+72*3")
    if len(str(abs(value))) > MAX_RESULT_DIGITS:
        raise ValueError(f"result has more than {MAX_RESULT_DIGITS} digits")
    return value

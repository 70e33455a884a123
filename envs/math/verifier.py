"""The math verifier: is a model's final answer equal to the gold answer?

What it is: answer extraction (every ``\\boxed{}``/``\\fbox{}``, or failing that the last final-
answer line such as ``The answer is 18`` or ``#### 18``), comparison under the rules below —
numbers by value in-process where they are plain literals, everything else read by
``math-verify`` — and the worker loop that envs/math/pool.py runs in killable processes.
What it is not: the pool, nor a grader of reasoning or of free-text answers.

Deliberate decisions where plain math-verify is too lenient or ambiguous (each has a test in
tests/envs/test_math_verifier.py):

* **No anchor, no answer.** math-verify alone would pick *any* number in a reply ("5 or 18"
  matches a gold 18). We grade only boxes, else the last final-answer line; a reply with
  neither scores 0.
* **Every box must be right.** A reply that boxes ``18`` and later ``20`` hedges: it scores
  0 whichever is right (grading only the last box would pay the hedge half the time).
  Repeating the answer (``\\boxed{18}`` ... ``\\boxed{18.0}``) is fine. Box only the final answer.
* **Hedged boxes fail.** ``\\boxed{18 \\text{ or } 20}`` is a set of two answers, never
  equal to one gold number.
* **Numbers are compared by value, with no absolute tolerance.** math-verify rounds floats
  to 6 decimal places, so any two numbers below 5e-7 are "equal" (``0.00000027557`` for
  1/11!, whose 1/10! differs by a factor of 11; ``10^{-20}`` for ``2 \\cdot 10^{-20}``). Here,
  when both sides are real numbers — integers, fractions, decimals, scientific notation
  (``1.5e-7``, ``1.5 \\times 10^{-7}``), or what math-verify evaluates (powers, radicals,
  π, factorials):
  - two rationals are equal only exactly. A decimal is the number it writes: ``0.5`` =
    ``1/2`` but ``0.333333`` ≠ ``1/3``, ``333/1000`` ≠ ``1/3``, ``1.000001`` ≠ ``1``;
  - with an irrational side, the values must agree to 40 significant digits (``\\sin(\\pi/12)``
    = ``(\\sqrt6-\\sqrt2)/4``; ``1.7320508`` ≠ ``\\sqrt3``: give exact answers exactly);
  - a decimal of 15 or more significant digits is a binary float's printout (a Python float
    gold: ``repr(1/3)``) and matches within a *relative* ``FLOAT_RTOL`` (1e-9);
  - ``-0`` is ``0``; integers of any length compare exactly.
* **Units are ignored.** ``5 \\text{ cm}``, ``5 cm`` and ``5`` match (and ``5 m``: units are
  neither converted nor compared); ``\\$18`` and ``30^\\circ`` likewise.
* **A percent sign is a unit of 1/100.** ``10%`` matches ``10`` in both directions, and
  ``0.1`` (the same quantity): GSM8K writes the golds of "what percent" questions bare, so
  rejecting ``\\boxed{25\\%}`` for gold 25 would mark right answers wrong. A bare number and
  its hundredth never match (gold ``10`` vs ``0.1`` scores 0), nor do ``50%`` and ``5``.
* **Unbracketed lists are ordered.** math-verify reads ``1, 2`` as the set {1, 2}, so
  ``2, 1`` would match. A gold written ``1, 2`` is compared item by item, in order (the
  reply may add brackets: ``(1, 2)``). Write the gold as a set, ``\\{1, 2\\}``, to accept
  any order.
* **Verifier timeouts score 0** (``math_reward_fn``): a reply that makes the verifier hang
  earns nothing; the pool counts it in ``stats["timeouts"]``.

Not covered: numbers inside sets, intervals, tuples, matrices and expressions with
variables are compared by math-verify (its decimals made exact first, so ``0.5x`` = ``x/2``
but ``0.333x`` ≠ ``x/3``); its numeric check there may still round away a difference
between two tiny irrational numbers.

Main hooks: ``extract_answers(response)``, ``normalize_gold(gold)``, ``compare(answer,
gold)`` (in-process, math-verify's signal-based timeouts: main thread only),
``compare_numbers(answer, gold)`` (plain literals only, microseconds: the pool decides these
without a worker); use ``envs.math.pool.math_reward_fn`` everywhere else.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from functools import lru_cache
from typing import Any

from agentrl.errors import VerifierError
from envs.math.numbers import (
    Number,
    compare_numbers,
    exact_decimals,
    number_from_sympy,
    numbers_equal,
    read_literal,
    split_percent,
)

# --------------------------------------------------------------------------- extraction


def _braced(text: str, open_at: int) -> str | None:
    """The text inside the brace group that opens at ``text[open_at] == '{'``."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
    return None


_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_LINE = re.compile(
    r"(?:^|\n)[ \t>*#_]*(?:####|(?:the\s+)?final\s+answer|(?:the\s+)?answer)\s*(?:is|:|=)?\s*[:=]?\s*(.+)",
    re.IGNORECASE,
)
_NUMBER_THEN_WORDS = re.compile(r"^(?:\\?\$)?\s*([-+]?\d[\d,]*(?:\.\d+)?\s*\\?%?)\s*(?:[A-Za-z][A-Za-z .]*)?$")


def _boxes(response: str) -> list[str]:
    """The non-empty contents of every box, in order."""
    found = (_braced(response, m.end() - 1) for m in _BOX.finditer(response))
    return [inner.strip() for inner in found if inner is not None and inner.strip()]


def extract_final_answer(response: str) -> str | None:
    """The answer a reply commits to last: its last box, else its last final-answer line, else None."""
    boxes = _boxes(response)
    return boxes[-1] if boxes else _final_line(response)


def extract_answers(response: str) -> list[str]:
    """Every answer a reply commits to, each once: its boxes, else its last final-answer line.
    The reply is right only if all of them are (two that differ are a hedge)."""
    boxes = _boxes(response)
    if boxes:
        return list(dict.fromkeys(boxes))
    line = _final_line(response)
    return [line] if line else []


def _final_line(response: str) -> str | None:
    lines = _ANSWER_LINE.findall(response)
    return (_clean(lines[-1]) or None) if lines else None


def _clean(text: str) -> str:
    text = text.strip().strip("*").strip()
    text = re.sub(r"^\$+|\$+$", "", text).strip()
    text = re.sub(r"^\\\(|\\\)$", "", text).strip()
    text = text.rstrip(".;!").strip()
    match = _NUMBER_THEN_WORDS.match(text)
    return match.group(1).strip() if match else text


def normalize_gold(gold: Any) -> str:
    """The gold answer as text: GSM8K's ``... #### 18`` -> ``18``; 27.0 -> ``27``."""
    if isinstance(gold, bool) or gold is None:
        raise VerifierError(f"a gold answer is a string or a number, got {gold!r}")
    if isinstance(gold, float):
        return str(int(gold)) if gold.is_integer() else repr(gold)
    if isinstance(gold, int):
        return str(gold)
    text = str(gold)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    text = text.strip()
    boxed = extract_final_answer(text) if _BOX.search(text) else None
    text = (boxed or text).strip().strip("$").strip()
    if not text:
        raise VerifierError(f"gold answer {gold!r} is empty after normalization")
    return text


# --------------------------------------------------------------------------- comparison (in a worker)


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0 and not text[max(0, i - 1) : i + 1].endswith("{,"):
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [s.strip() for s in items]


def _unwrap(text: str) -> str:
    text = text.strip()
    for left, right in (("\\left(", "\\right)"), ("\\left[", "\\right]"), ("\\{", "\\}"), ("(", ")"), ("[", "]")):
        if text.startswith(left) and text.endswith(right):
            return text[len(left) : -len(right)].strip()
    return text


@lru_cache(maxsize=4096)
def _parse(text: str, timeout_s: int) -> Any:
    """math-verify's readings of ``text`` (a sympy object first, then strings); golds repeat."""
    from math_verify import parse

    return parse(f"${text}$", parsing_timeout=timeout_s)


def _is_unordered_list(parsed: Any, text: str) -> bool:
    """math-verify read ``text`` as a set although it was written without set braces."""
    import sympy

    return bool(parsed) and isinstance(parsed[0], sympy.FiniteSet) and not text.lstrip().startswith(("\\{", "\\left\\{"))


def _reading(text: str, timeout_s: int) -> Any:
    """``text`` as a literal ``Number``, else math-verify's first reading of it without a
    trailing percent sign (percent is our rule, applied in ``numbers_equal``), else None."""
    literal = read_literal(text)
    if literal is not None:
        return literal
    parsed = _parse(split_percent(text)[0], timeout_s)
    return parsed[0] if parsed else None


def _as_number(reading: Any, text: str, answer: bool) -> Number | None:
    """A reading that is one real number. A reply's assignment ``x = 5`` counts as 5 when
    the gold is a number (as math-verify reads it)."""
    from math_verify.grader import is_assignment_relation, take_last_relation

    if isinstance(reading, Number):
        return reading
    if answer and is_assignment_relation(reading):
        reading = take_last_relation(reading).rhs
    body, percent = split_percent(text)
    return number_from_sympy(reading, body, percent)


def _compare_as_numbers(answer: str, gold: str, timeout_s: int) -> bool | None:
    """The verdict when both sides read as real numbers, else None. Parsing has its own
    timeout; evaluating (sympy's ``doit`` and ``N``) runs under this one."""
    from math_verify.errors import TimeoutException
    from math_verify.utils import timeout

    gold_reading, answer_reading = _reading(gold, timeout_s), _reading(answer, timeout_s)

    @timeout(timeout_seconds=timeout_s)
    def decide() -> bool | None:
        g = _as_number(gold_reading, gold, answer=False)
        a = _as_number(answer_reading, answer, answer=True) if g is not None else None
        return numbers_equal(a, g) if a is not None and g is not None else None

    try:
        return decide()
    except TimeoutException:
        raise VerifierError(f"comparing {answer[:80]!r} with {gold[:80]!r} as numbers took over {timeout_s} s") \
            from None


def compare(answer: str, gold: str, timeout_s: int = 3) -> bool:
    """Whether the extracted ``answer`` equals the normalized ``gold`` (the rules above)."""
    from math_verify import verify

    answer = re.sub(r"(?<!\\)\$", "", answer).strip()
    quick = compare_numbers(answer, gold)
    if quick is not None:
        return quick
    gold_parsed = _parse(gold, timeout_s)
    if not gold_parsed:
        raise VerifierError(f"math-verify cannot read the gold answer {gold!r}")
    if _is_unordered_list(gold_parsed, gold):
        gold_items = _split_top_level(gold)
        answer_items = _split_top_level(_unwrap(answer))
        if len(gold_items) != len(answer_items):
            return False
        return all(compare(a, g, timeout_s) for a, g in zip(answer_items, gold_items, strict=True))
    as_numbers = _compare_as_numbers(answer, gold, timeout_s)
    if as_numbers is not None:
        return as_numbers
    answer_parsed = _parse(answer, timeout_s)
    if not answer_parsed:
        return False
    # math-verify rounds Floats to 6 decimal places: made exact first, its decimals compare by value
    golds, answers = [exact_decimals(x) for x in gold_parsed], [exact_decimals(x) for x in answer_parsed]
    return bool(verify(golds, answers, timeout_seconds=timeout_s))


def _worker_main() -> None:
    """A verifier worker (``python -c``): says ``["ready"]`` once imported, then reads JSON
    lines ``[answer, gold]`` on stdin and answers ``["ok", bool]`` or ``["error", message]``
    on the original stdout."""
    import resource

    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # anything printed by libraries goes to stderr, never into the protocol
    limit_mb = int(os.environ.get("AGENTRL_VERIFIER_MEMORY_MB", "0"))
    if limit_mb:
        resource.setrlimit(resource.RLIMIT_AS, (limit_mb << 20, limit_mb << 20))
    soft_timeout_s = int(os.environ.get("AGENTRL_VERIFIER_SOFT_TIMEOUT_S", "3"))
    import math_verify  # noqa: F401  (imported before the first task, not during it)

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    protocol.write(json.dumps(["ready"]) + "\n")
    protocol.flush()
    for line in sys.stdin:
        answer, gold = json.loads(line)
        try:
            reply: list[Any] = ["ok", compare(answer, gold, soft_timeout_s)]
        except VerifierError as e:
            reply = ["error", str(e)]
        except Exception as e:
            reply = ["error", f"{type(e).__name__}: {e}"]
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()

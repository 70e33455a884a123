"""The math verifier: is a model's final answer equal to the gold answer?

What it is: answer extraction (the last ``\\boxed{}``/``\\fbox{}``, or failing that a final-
answer line such as ``The answer is 18`` or ``#### 18``), comparison with ``math-verify``
(symbolic and numeric equality of LaTeX or plain answers) under the rules below, and the
worker loop that envs/math/pool.py runs in killable processes. What it is not: the pool,
nor a grader of reasoning or of free-text answers.

Deliberate decisions where plain math-verify is too lenient or ambiguous (each has a test in
tests/envs/test_math_verifier.py):

* **No anchor, no answer.** math-verify alone would pick *any* number in a reply ("5 or 18"
  matches a gold 18). We grade only the last box, else the last final-answer line; a reply
  with neither scores 0.
* **Unbracketed lists are ordered.** math-verify reads ``1, 2`` as the set {1, 2}, so
  ``2, 1`` would match. A gold written ``1, 2`` is compared item by item, in order (the
  reply may add brackets: ``(1, 2)``). Write the gold as a set, ``\\{1, 2\\}``, to accept
  any order.
* **A percent sign is a unit.** ``10%`` matches ``10`` in both directions, and ``0.1`` (the
  same quantity): GSM8K writes the golds of "what percent" questions bare, so rejecting
  ``\\boxed{25\\%}`` for gold 25 would mark right answers wrong. A bare number and its
  hundredth never match (gold ``10`` vs ``0.1`` scores 0).
* **Hedged boxes fail.** ``\\boxed{18 \\text{ or } 20}`` is a set of two answers, never
  equal to one gold number.
* **Plain integers are compared as integers** (``compare_integers``: ``025`` = ``25``,
  ``1,000`` = ``1000``), in-process, without math-verify — the same verdicts (a test checks
  they agree), in microseconds.
* **Verifier timeouts score 0** (``math_reward_fn``): a reply that makes the verifier hang
  earns nothing; the pool counts it in ``stats["timeouts"]``.

Main hooks: ``extract_final_answer(response)``, ``normalize_gold(gold)``,
``compare(answer, gold)`` (in-process, math-verify's signal-based timeouts: main thread
only); use ``envs.math.pool.math_reward_fn`` everywhere else.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from typing import Any

from agentrl.errors import VerifierError

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


def extract_final_answer(response: str) -> str | None:
    """The answer a reply commits to: the last box, else the last final-answer line, else None."""
    boxes = [m for m in _BOX.finditer(response)]
    for m in reversed(boxes):
        inner = _braced(response, m.end() - 1)
        if inner is not None and inner.strip():
            return inner.strip()
    lines = _ANSWER_LINE.findall(response)
    if lines:
        return _clean(lines[-1]) or None
    return None


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


_GOLD_CACHE: dict[str, Any] = {}


def _parse(text: str, timeout_s: int) -> Any:
    from math_verify import parse

    return parse(f"${text}$", parsing_timeout=timeout_s)


def _parse_gold(text: str, timeout_s: int) -> Any:
    if text not in _GOLD_CACHE:
        if len(_GOLD_CACHE) > 4096:
            _GOLD_CACHE.clear()
        _GOLD_CACHE[text] = _parse(text, timeout_s)
    return _GOLD_CACHE[text]


def _is_unordered_list(parsed: Any, text: str) -> bool:
    """math-verify read ``text`` as a set although it was written without set braces."""
    import sympy

    return bool(parsed) and isinstance(parsed[0], sympy.FiniteSet) and not text.lstrip().startswith(("\\{", "\\left\\{"))


_PLAIN_INTEGER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d{1,100})")


def compare_integers(answer: str, gold: str) -> bool | None:
    """The verdict when both sides are plain integers (``18``, ``-3``, ``025``, ``1,000``),
    else None. It is math-verify's verdict on such pairs (a test checks they agree), reached
    in microseconds and in-process — GSM8K's golds and most replies are plain integers."""
    a, g = answer.strip(), gold.strip()
    if not (_PLAIN_INTEGER.fullmatch(a) and _PLAIN_INTEGER.fullmatch(g)):
        return None
    return int(a.replace(",", "")) == int(g.replace(",", ""))


def compare(answer: str, gold: str, timeout_s: int = 3) -> bool:
    """Whether the extracted ``answer`` equals the normalized ``gold`` (the rules above)."""
    from math_verify import verify

    answer = re.sub(r"(?<!\\)\$", "", answer).strip()
    quick = compare_integers(answer, gold)
    if quick is not None:
        return quick
    gold_parsed = _parse_gold(gold, timeout_s)
    if not gold_parsed:
        raise VerifierError(f"math-verify cannot read the gold answer {gold!r}")
    if _is_unordered_list(gold_parsed, gold):
        gold_items = _split_top_level(gold)
        answer_items = _split_top_level(_unwrap(answer))
        if len(gold_items) != len(answer_items):
            return False
        return all(compare(a, g, timeout_s) for a, g in zip(answer_items, gold_items, strict=True))
    answer_parsed = _parse(answer, timeout_s)
    if not answer_parsed:
        return False
    return bool(verify(gold_parsed, answer_parsed, timeout_seconds=timeout_s))


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

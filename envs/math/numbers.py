"""Numbers as written in math answers, and when two of them are equal.

What it is: a reader of plain number literals (integers with or without thousands
separators, decimals, scientific notation, fractions, with a unit, currency or percent sign)
into exact ``Fraction``s, in microseconds and in-process; the conversion of math-verify's
sympy readings into the same ``Number``; and the equality rules of envs/math/verifier.py
(exact for rationals, 40 digits with an irrational side, a relative tolerance for float
printouts — never an absolute one). What it is not: extraction, parsing of general LaTeX
(math-verify does that), nor the comparison of sets, tuples or expressions.

Main hooks: ``compare_numbers(answer, gold)`` (both literals, else None), ``read_literal``,
``number_from_sympy`` and ``numbers_equal``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

FLOAT_RTOL = Fraction(1, 10**9)
"""Relative tolerance when a side is a float's printout (a decimal of ``FLOAT_DIGITS``+ digits)."""
FLOAT_DIGITS = 15
"""Significant digits from which a written decimal is taken as a binary float's printout."""
_EXACT_DIGITS = 40
"""Agreement, in significant digits, that makes two exact values with an irrational side equal."""
_MAX_LITERAL = 1000
"""Longest text read as a literal in-process (Python refuses int strings of over 4300 digits)."""
_MAX_EXPONENT = 1000

_UNSIGNED = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+"
_EXPONENT = r"[eE]([-+]?\d+)|\s*(?:\\times|\\cdot|\*|×|·)\s*10\s*\^\s*(?:\{\s*([-+]?\d+)\s*\}|([-+]?\d))"
_DECIMAL = re.compile(rf"([-+]?)({_UNSIGNED})(?:{_EXPONENT})?")
_POWER_OF_TEN = re.compile(r"([-+]?)10\s*\^\s*(?:\{\s*([-+]?\d+)\s*\}|([-+]?\d))")
_FRACTION = re.compile(
    rf"([-+]?)\\[dt]?frac\s*(?:\{{\s*([-+]?(?:{_UNSIGNED}))\s*\}}\s*\{{\s*([-+]?(?:{_UNSIGNED}))\s*\}}|(\d)\s*(\d))")
_SLASH = re.compile(r"([-+]?)(\d+)\s*/\s*(\d+)")
_PERCENT = re.compile(r"\s*(?:\\%|%|\\text\s*\{\s*(?:\\?%|percent)\s*\}|\bpercent)\s*$")
_UNIT_TEXT = re.compile(r"\s*\\(?:text|mathrm|mbox|textrm)\s*\{[^{}]*\}(?:\s*\^\s*\{?\s*\d\s*\}?)?\s*$")
_DEGREES = re.compile(r"\s*\^\s*\{?\s*\\circ\s*\}?\s*$")
_THOUSANDS_SPACE = re.compile(r"(?<=\d)(?:\\[,;: !]|\{,\}|~)(?=\d)")
_THIN_SPACE = re.compile(r"\\[,;:! ]|~")
_DECIMALS_IN_TEXT = re.compile(r"\d*\.\d+")


@dataclass(frozen=True)
class Number:
    """A real number as written: ``value`` exact (a Fraction, or a sympy expression when
    irrational), ``inexact`` when written as a float's printout, ``percent`` when written with %."""

    value: Any
    inexact: bool = False
    percent: bool = False


def _significant(decimal: str) -> str:
    return decimal.replace(",", "").replace(".", "").lstrip("+-0").rstrip("0")


def _is_float_printout(decimal: str, exponent: int = 0) -> bool:
    """Whether a decimal (mantissa and power of ten) is how Python prints a float: at least
    ``FLOAT_DIGITS`` significant digits, and exactly the shortest digits of the nearest float."""
    digits = _significant(decimal)
    if len(digits) < FLOAT_DIGITS or "." not in decimal:
        return False
    try:
        nearest = float(f"{decimal.replace(',', '')}e{exponent}")
    except OverflowError:
        return False
    return _significant(repr(nearest).split("e")[0]) == digits


def _has_float_printout(text: str) -> bool:
    return any(_is_float_printout(d) for d in _DECIMALS_IN_TEXT.findall(text))


def split_percent(text: str) -> tuple[str, bool]:
    body = _PERCENT.sub("", text)
    return body, body != text


def _fraction(text: str, exponent: str | None = None) -> Fraction | None:
    power = int(exponent or 0)
    if abs(power) > _MAX_EXPONENT:
        return None  # left to math-verify in a killable worker
    return Fraction(text.replace(",", "")) * Fraction(10) ** power


def read_literal(text: str) -> Number | None:
    """``text`` as a plain number — an integer, decimal, scientific notation, fraction, with a
    unit, a currency sign or a percent sign — else None (then math-verify reads it)."""
    if len(text) > _MAX_LITERAL:
        return None
    text, percent = split_percent(text.strip())
    text = _THIN_SPACE.sub(" ", _THOUSANDS_SPACE.sub(",", text)).replace("−", "-")
    text = _DEGREES.sub("", _UNIT_TEXT.sub("", text)).strip()
    text = re.sub(r"^\\\$\s*", "", text).rstrip(".")  # a currency sign; a sentence's full stop
    inexact = False
    if m := _DECIMAL.fullmatch(text):
        sign, digits, *exponents = m.groups()
        exponent = next((e for e in exponents if e), None)
        value = _fraction(digits, exponent)
        inexact = value is not None and _is_float_printout(digits, int(exponent or 0))
    elif m := _POWER_OF_TEN.fullmatch(text):
        sign, value = m.group(1), _fraction("1", m.group(2) or m.group(3))
    elif m := _FRACTION.fullmatch(text):
        sign, num, den = m.group(1), m.group(2) or m.group(4), m.group(3) or m.group(5)
        top, bottom = _fraction(num), _fraction(den)
        value = top / bottom if top is not None and bottom else None
        inexact = _is_float_printout(num) or _is_float_printout(den)
    elif m := _SLASH.fullmatch(text):
        sign, num, den = m.groups()
        value = Fraction(int(num), int(den)) if int(den) else None
    else:
        return None
    if value is None:
        return None
    return Number(-value if sign == "-" else value, inexact, percent)


def exact_decimals(expr: Any) -> Any:
    """``expr`` with math-verify's Floats (read from decimals) replaced by the exact decimals."""
    import sympy

    if not isinstance(expr, sympy.Basic):
        return expr
    return expr.xreplace({f: sympy.Rational(str(f)) for f in expr.atoms(sympy.Float)})


def number_from_sympy(expr: Any, text: str, percent: bool) -> Number | None:
    """A math-verify reading that is one finite real number, as a ``Number``; else None."""
    import sympy

    if not isinstance(expr, sympy.Expr) or not expr.is_number:
        return None
    value = exact_decimals(expr).doit()
    if value.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan) or value.is_real is False:
        return None
    if value.is_Rational:
        value = Fraction(int(value.p), int(value.q))
    return Number(value, _has_float_printout(text), percent)


def _values_equal(x: Any, y: Any, inexact: bool) -> bool | None:
    """Exact equality of rationals; agreement to ``_EXACT_DIGITS`` digits with an irrational
    side; relative ``FLOAT_RTOL`` when ``inexact``. None when sympy cannot evaluate a side."""
    if isinstance(x, Fraction) and isinstance(y, Fraction):
        return abs(x - y) <= FLOAT_RTOL * max(abs(x), abs(y)) if inexact else x == y
    import sympy

    digits = _EXACT_DIGITS + 20
    xs, ys = (sympy.N(sympy.Rational(v.numerator, v.denominator) if isinstance(v, Fraction) else v, digits)
              for v in (x, y))
    if not (xs.is_Number and ys.is_Number):
        return None
    rtol = sympy.Float(FLOAT_RTOL.numerator, digits) / FLOAT_RTOL.denominator if inexact \
        else sympy.Float(10, digits) ** -_EXACT_DIGITS
    return bool(abs(xs - ys) <= rtol * max(abs(xs), abs(ys)))


def numbers_equal(answer: Number, gold: Number) -> bool | None:
    """The rules of envs/math/verifier.py; a percent on one side only also accepts that side's hundredth."""
    pairs = [(answer.value, gold.value)]
    if gold.percent and not answer.percent:
        pairs.append((answer.value, gold.value / 100))
    elif answer.percent and not gold.percent:
        pairs.append((answer.value / 100, gold.value))
    verdicts = [_values_equal(a, g, answer.inexact or gold.inexact) for a, g in pairs]
    return True if True in verdicts else (None if None in verdicts else False)


def compare_numbers(answer: str, gold: str) -> bool | None:
    """The verdict when both sides are plain number literals (``18``, ``025``, ``1,000``,
    ``-0.5``, ``\\frac{1}{3}``, ``1.5e-7``, ``25\\%``, ``5\\text{ cm}``), else None. Microseconds,
    in-process, no math-verify — the pool decides most GSM8K replies this way."""
    a, g = read_literal(answer), read_literal(gold)
    return numbers_equal(a, g) if a is not None and g is not None else None

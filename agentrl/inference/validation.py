"""Complete validation of generation requests before they reach the engine of ``agentrl serve``.

What it is: ``Bounds`` (the limits a request is checked against: the model's context and
vocabulary, the server's caps on ``n`` and ``top_logprobs_num``) and the parsers of SGLang's
request vocabulary — ``parse_sampling`` for one ``sampling_params`` object (every key of
sglang 0.5.23's ``python/sglang/srt/sampling/sampling_params.py``, with its defaults and
ranges) and ``parse_logprob_fields`` for the top-level logprob fields of ``GenerateReqInput``
(``python/sglang/srt/managers/io_struct.py``). Every failure is a ``Refused`` whose message
names the field, what came and what is allowed; whatever passes is within the bounds, so the
engine never sees a value it cannot handle (a top-k of 10^20, a negative top-logprob count).

Accepted and implemented: every sampling key but the grammars. ``json_schema``, ``regex``,
``ebnf`` and ``structural_tag`` are accepted when null (SGLang's own frontend sends them so)
and refused with a 400 that says so otherwise; ``custom_params`` is accepted and unused (it
feeds custom logit processors, which are refused). ``top_k`` above the vocabulary (SGLang's
"all" is 2^30) keeps every token; above 2^30 it is refused.

What it is not: result shapes and body parsing (``wire``), or chat-format checks (``chat_format``).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Any

from agentrl.api import SamplingParams
from agentrl.errors import Refused
from agentrl.inference.wire import check_type

GRAMMAR_KEYS = ("json_schema", "regex", "ebnf", "structural_tag")
TOP_K_ALL = 1 << 30
"""SGLang's "whole vocabulary" top-k; larger values are refused."""
MAX_STOP = 32
MAX_STOP_REGEX_BYTES = 256
MAX_STOP_TOKEN_IDS = 1024
MAX_STREAM_INTERVAL = 1 << 20
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)
@dataclass(frozen=True)
class Bounds:
    """What a request is checked against."""

    context_length: int
    vocab_size: int | None = None  # None: token ids are not checked (a client without the model)
    max_n: int = 256
    max_top_logprobs: int = 64


@dataclass(frozen=True)
class Key:
    """One key of a request body, declared once: its kind, default and range. ``parse_sampling``
    (and the OpenAI routes) check values with it; ``agentrl.inference.openapi`` writes its JSON
    Schema from it. ``hi`` may name a bound of the server instead of a number: ``"context"``
    (the context length - 1), ``"max_n"``, ``"max_top_logprobs"``. Kinds: ``number``,
    ``integer``, ``flag``, ``strings`` (one or a list), ``token_ids``, ``logit_bias``,
    ``object``, ``top_k``, ``null`` (accepted only as null: the grammar keys)."""

    kind: str
    default: Any = None
    lo: float | None = None
    hi: float | str | None = None
    lo_open: bool = False
    nullable: bool = False
    note: str = ""  # said after the range in an error, e.g. "(this server's --max-n)"
    words: str = ""  # the allowed values in words, when not the range

    def high(self, b: Bounds) -> float | None:
        if isinstance(self.hi, str):
            return {"context": b.context_length - 1, "max_n": b.max_n,
                    "max_top_logprobs": b.max_top_logprobs}[self.hi]
        return self.hi

    def what(self, b: Bounds) -> str:
        """The allowed values in words."""
        lo, hi = self.lo, self.high(b)
        if self.words or self.kind == "flag":
            return self.words or "true or false"
        if hi is None or hi == math.inf:
            said = (f"{'a finite number' if self.kind == 'number' else 'an integer'} "
                    f"{'>' if self.lo_open else '>='} {_fmt(lo)}")
        else:
            said = (f"{'a number' if self.kind == 'number' else 'an integer'} in "
                    f"{'(' if self.lo_open else '['}{_fmt(lo)}, {_fmt(hi)}]")
        return f"{said} {self.note}".strip()

    def read(self, name: str, value: Any, b: Bounds) -> Any:
        """``value`` checked (None: the default), or a ``Refused`` naming ``name``."""
        if value is None:
            return self.default
        if self.kind == "flag":
            check_type(name, value, (bool,), "true or false")
            return value
        hi = self.high(b)
        if self.kind == "integer":
            return _integer(name, value, int(self.lo), int(hi if hi is not None else 1 << 62), self.what(b))
        return _number(name, value, self.lo, hi if hi is not None else math.inf, lo_open=self.lo_open,
                       what=self.what(b))

    def schema(self, b: Bounds) -> dict[str, Any]:
        """The JSON Schema of the key's values (within the server's bounds)."""
        hi = self.high(b)
        if self.kind in ("number", "integer"):
            out: dict[str, Any] = {"type": [self.kind, "null"] if self.nullable else self.kind}
            out["exclusiveMinimum" if self.lo_open else "minimum"] = self.lo
            if hi is not None and hi != math.inf:
                out["maximum"] = hi
            return out
        strings = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"},
                                                  "maxItems": MAX_STOP}, {"type": "null"}]}
        return {
            "flag": {"type": "boolean"},
            "strings": strings,
            "token_ids": {"type": ["array", "null"], "items": {"type": "integer"}, "maxItems": MAX_STOP_TOKEN_IDS},
            "logit_bias": {"type": ["object", "null"], "propertyNames": {"pattern": "^[0-9]+$"},
                           "additionalProperties": {"type": "number", "minimum": -1e6, "maximum": 1e6}},
            "object": {"type": ["object", "null"]},
            "top_k": {"anyOf": [{"const": -1}, {"type": "integer", "minimum": 1, "maximum": TOP_K_ALL}]},
            "null": {"type": "null"},
        }[self.kind]


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


SAMPLING: dict[str, Key] = {
    "max_new_tokens": Key("integer", 128, 0, "context", nullable=True),  # null: up to the context
    "min_new_tokens": Key("integer", 0, 0, "context"),  # and at most max_new_tokens
    "temperature": Key("number", 1.0, 0, math.inf),
    "top_p": Key("number", 1.0, 0, 1, lo_open=True),
    "top_k": Key("top_k", -1),
    "min_p": Key("number", 0.0, 0, 1),
    "frequency_penalty": Key("number", 0.0, -2, 2),
    "presence_penalty": Key("number", 0.0, -2, 2),
    "repetition_penalty": Key("number", 1.0, 0, 2, lo_open=True),
    "stop": Key("strings"),
    "stop_regex": Key("strings"),
    "stop_token_ids": Key("token_ids"),
    "ignore_eos": Key("flag", False),
    "skip_special_tokens": Key("flag", True),
    "spaces_between_special_tokens": Key("flag", True),
    "no_stop_trim": Key("flag", False),
    "n": Key("integer", 1, 1, "max_n", note="(this server's --max-n)"),
    "sampling_seed": Key("integer", None, SEED_RANGE[0], SEED_RANGE[1], nullable=True, words="a 64-bit integer"),
    **{k: Key("null") for k in GRAMMAR_KEYS},
    "logit_bias": Key("logit_bias"),
    "stream_interval": Key("integer", None, 1, MAX_STREAM_INTERVAL, nullable=True),
    "custom_params": Key("object"),
}
"""SGLang's ``sampling_params`` (sglang 0.5.23 ``sampling_params.py``): every key, its default
and range — the one declaration the parser below and the OpenAPI schema read."""
SAMPLING_KEYS = tuple(SAMPLING)

LOGPROB_FIELDS: dict[str, Key] = {
    "return_logprob": Key("flag", False),
    "logprob_start_len": Key("integer", -1, -1, "context"),  # and at most the prompt's length
    "top_logprobs_num": Key("integer", 0, 0, "max_top_logprobs", note="(this server's --max-top-logprobs-num)"),
}
"""``GenerateReqInput``'s logprob fields (one value, or one per prompt of a batch)."""


def _number(name: str, value: Any, lo: float, hi: float, *, lo_open: bool = False, what: str = "") -> float:
    what = what or f"a number in {'(' if lo_open else '['}{lo}, {hi}]"
    check_type(name, value, (int, float), what)
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        raise Refused(f"{name} must be {what}, got an integer of {len(str(value))} digits") from None
    if not (math.isfinite(number) and (number > lo if lo_open else number >= lo) and number <= hi):
        raise Refused(f"{name} must be {what}, got {value}")
    return number


def _integer(name: str, value: Any, lo: int, hi: int, what: str = "") -> int:
    what = what or f"an integer in [{lo}, {hi}]"
    check_type(name, value, (int,), what)
    if not lo <= value <= hi:
        raise Refused(f"{name} must be {what}, got {value}")
    return value


def _strings(name: str, value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise Refused(f"{name} must be a string or a list of strings")
    if len(value) > MAX_STOP:
        raise Refused(f"{name} holds {len(value)} strings; at most {MAX_STOP} are allowed")
    return [s for s in value if s]


@functools.lru_cache(maxsize=1024)
def compiled(pattern: str) -> re.Pattern:
    """A ``stop_regex`` pattern, compiled once (it was checked by ``parse_sampling``)."""
    return re.compile(pattern)


def parse_sampling(sp: Any, *, prompt_len: int, bounds: Bounds) -> dict[str, Any]:
    """Validate one ``sampling_params`` object for a prompt of ``prompt_len`` tokens.

    Returns ``{"sampling": SamplingParams, "n", "no_stop_trim", "skip_special_tokens",
    "spaces_between_special_tokens", "stream_interval"}``. A null value means the default,
    as in SGLang.
    """
    if sp is None:
        sp = {}
    if not isinstance(sp, dict):
        raise Refused(f"sampling_params must be an object, got {type(sp).__name__}")
    for key in sp:
        if key not in SAMPLING_KEYS:
            raise Refused(f"unknown field `{key}`, expected one of {', '.join(f'`{k}`' for k in SAMPLING_KEYS)}")
    for key in GRAMMAR_KEYS:
        if sp.get(key) is not None:
            raise Refused(f"sampling_params.{key} is a grammar constraint, which agentrl serve does not "
                             "implement; leave it null, or use SGLang on a GPU")
    ctx = bounds.context_length
    if prompt_len >= ctx:
        raise Refused(f"The input ({prompt_len} tokens) is longer than the model's context length "
                         f"({ctx} tokens).")
    max_new = sp.get("max_new_tokens", SAMPLING["max_new_tokens"].default)
    if max_new is None:  # SGLang: no cap but the context
        max_new = ctx - prompt_len
    sp = {k: v for k, v in sp.items() if v is not None}
    out: dict[str, Any] = {}
    max_new = _integer("sampling_params.max_new_tokens", max_new, 0, 1 << 62, "an integer >= 0")
    if prompt_len + max_new > ctx:
        raise Refused(f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
                         f"You requested a total of {prompt_len + max_new} tokens: {prompt_len} tokens from "
                         f"the input messages and {max_new} tokens for the completion. Please reduce the "
                         "number of tokens in the input messages or the completion to fit within the limit.")
    out["max_new_tokens"] = max_new
    out["min_new_tokens"] = _integer("sampling_params.min_new_tokens", sp.get("min_new_tokens", SAMPLING["min_new_tokens"].default), 0, max_new,
                                     f"an integer in [0, max_new_tokens={max_new}]")
    for key in ("temperature", "top_p"):
        out[key] = SAMPLING[key].read(f"sampling_params.{key}", sp.get(key), bounds)
    k = sp.get("top_k", SAMPLING["top_k"].default)
    check_type("sampling_params.top_k", k, (int,), f"-1 (all) or an integer in [1, {TOP_K_ALL}]")
    if not (k == -1 or 1 <= k <= TOP_K_ALL):
        raise Refused(f"sampling_params.top_k must be -1 (no cut) or in [1, {TOP_K_ALL}] (values above the "
                         f"vocabulary keep every token), got {k}")
    out["top_k"] = -1 if k == TOP_K_ALL or (bounds.vocab_size and k >= bounds.vocab_size) else k
    for key in ("min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "ignore_eos"):
        out[key] = SAMPLING[key].read(f"sampling_params.{key}", sp.get(key), bounds)
    out["stop"] = _strings("sampling_params.stop", sp.get("stop"))
    regexes = _strings("sampling_params.stop_regex", sp.get("stop_regex"))
    for pattern in regexes:
        size = len(pattern.encode("utf-8", "surrogatepass"))
        if size > MAX_STOP_REGEX_BYTES:
            raise Refused(f"sampling_params.stop_regex patterns are at most {MAX_STOP_REGEX_BYTES} bytes; "
                             f"one has {size}")
        try:
            compiled(pattern)
        except (re.error, RecursionError, OverflowError) as e:
            raise Refused(f"sampling_params.stop_regex {pattern!r} is not a valid regular expression ({e})") from e
    out["stop_regex"] = regexes
    ids = sp.get("stop_token_ids", [])
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise Refused("sampling_params.stop_token_ids must be a list of token ids (integers)")
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise Refused(f"sampling_params.stop_token_ids holds {len(ids)} ids; at most {MAX_STOP_TOKEN_IDS} are allowed")
    out["stop_token_ids"] = [i for i in ids if 0 <= i < (bounds.vocab_size or 1 << 62)]  # others never come
    out["seed"] = SAMPLING["sampling_seed"].read("sampling_params.sampling_seed", sp.get("sampling_seed"), bounds)
    out["logit_bias"] = _logit_bias(sp.get("logit_bias", {}), bounds.vocab_size)
    n = SAMPLING["n"].read("sampling_params.n", sp.get("n"), bounds)
    interval = SAMPLING["stream_interval"].read("sampling_params.stream_interval", sp.get("stream_interval"), bounds)
    custom = sp.get("custom_params")
    if custom is not None and not isinstance(custom, dict):
        raise Refused(f"sampling_params.custom_params must be an object, got {type(custom).__name__}")
    flags = {key: SAMPLING[key].read(f"sampling_params.{key}", sp.get(key), bounds)
             for key in ("no_stop_trim", "skip_special_tokens", "spaces_between_special_tokens")}
    return {"sampling": SamplingParams(**out), "n": n, **flags, "stream_interval": interval or 1}


def _flag(name: str, value: Any) -> bool:
    check_type(name, value, (bool,), "true or false")
    return value


def _logit_bias(value: Any, vocab_size: int | None) -> dict[int, float]:
    if not isinstance(value, dict):
        raise Refused(f"sampling_params.logit_bias must be an object of token id -> number, got "
                         f"{type(value).__name__}")
    out: dict[int, float] = {}
    for key, bias in value.items():
        try:
            tid = int(key)
        except ValueError:
            raise Refused(f"sampling_params.logit_bias keys must be token ids, got {key!r}") from None
        if not 0 <= tid < (vocab_size or 1 << 62):
            raise Refused(f"sampling_params.logit_bias keys must be token ids in [0, {vocab_size}), got {key}")
        out[tid] = _number(f"sampling_params.logit_bias[{key!r}]", bias, -1e6, 1e6)
    return out


def per_prompt(body: dict[str, Any], key: str, default: Any, count: int) -> list[Any]:
    """A batchable top-level field as one value per prompt (a list must have one per prompt)."""
    value = body.get(key)
    if value is None:
        return [default] * count
    if isinstance(value, list):
        if len(value) != count:
            raise Refused(f"{key} is a list of {len(value)} but there are {count} prompts")
        return [default if v is None else v for v in value]
    return [value] * count


def parse_logprob_fields(body: dict[str, Any], prompt_lens: list[int], bounds: Bounds) -> list[dict[str, Any]]:
    """``return_logprob``, ``logprob_start_len`` and ``top_logprobs_num`` (one value, or a
    list with one per prompt), checked: per prompt ``{"return_logprob", "logprob_start",
    "top_n"}``. ``logprob_start`` is -1 (no prompt logprobs) or a prompt position <= its length."""
    count = len(prompt_lens)
    wants, starts, tops = (per_prompt(body, key, LOGPROB_FIELDS[key].default, count) for key in LOGPROB_FIELDS)
    out = []
    for want, start, top, length in zip(wants, starts, tops, prompt_lens, strict=True):
        want = LOGPROB_FIELDS["return_logprob"].read("return_logprob", want, bounds)
        top = LOGPROB_FIELDS["top_logprobs_num"].read("top_logprobs_num", top, bounds)
        start = _integer("logprob_start_len", start, -1, length,
                         f"-1 (no prompt logprobs) or a prompt position in [0, {length}] (the prompt's length)")
        out.append({"return_logprob": want, "logprob_start": start if want else -1, "top_n": top if want else 0})
    _flag("return_text_in_logprobs", body.get("return_text_in_logprobs") or False)
    return out

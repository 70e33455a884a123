"""The request bodies of ``agentrl serve``'s routes as JSON Schema, for its OpenAPI document.

What it is: the generation bodies' schemas (SGLang's ``GenerateReqInput`` and
``sampling_params``, the OpenAI chat and completion requests), attached to the routes with
``agentrl.http_edge.json_body(schema)`` so that ``GET /openapi.json`` describes what each
route reads (the control routes' bodies are ``control_bodies``' dataclasses) — for client
generators, and for the fuzz test that sends schema-shaped and schema-violating bodies to
every route (``tests/inference/test_fuzz.py``). The generation schemas carry the served
model's and the server's own bounds (``Bounds``: token ids below the vocabulary size,
``max_new_tokens`` within the context, the caps on ``n`` and top-logprobs), so a body drawn
from them is mostly one the engine runs.

The sampling keys (SGLang's and their OpenAI names) and the logprob fields are written from
their one declaration, ``validation.SAMPLING`` and ``validation.LOGPROB_FIELDS``, which the
parsers read too. What it is not: validation — the routes parse their bodies themselves
(``wire``, ``validation``) and answer a 4xx naming the field (FastAPI's own 422 never fires).
Some limits depend on several fields at once (prompt + output within the context, one
``sampling_params`` per prompt of a batch, ``logprob_start_len`` within the prompt) and are
checked only there.
"""

from __future__ import annotations

from typing import Any

from agentrl.inference.chat_format import OPENAI_SAMPLING
from agentrl.inference.validation import LOGPROB_FIELDS, SAMPLING, Bounds

Schema = dict[str, Any]


def _one_or_many(item: Schema) -> Schema:
    return {"anyOf": [item, {"type": "array", "items": item, "minItems": 1}]}


_BOOL = {"type": "boolean"}
_STR = {"type": "string"}


def _tokens(b: Bounds) -> Schema:
    """A prompt as token ids: within the vocabulary, shorter than the context."""
    item: Schema = {"type": "integer", "minimum": 0}
    if b.vocab_size:
        item["maximum"] = b.vocab_size - 1
    return {"type": "array", "items": item, "minItems": 1, "maxItems": b.context_length - 1}


def sampling_params(b: Bounds) -> Schema:
    """SGLang's ``sampling_params`` within ``b``, from its declaration (``validation.SAMPLING``)."""
    return {"type": "object", "properties": {name: key.schema(b) for name, key in SAMPLING.items()},
            "additionalProperties": False}


def generate(b: Bounds) -> Schema:
    """``/generate``'s body (``GenerateReqInput``): exactly one of ``text`` and ``input_ids``,
    one prompt or a batch."""
    return {
        "type": "object",
        "oneOf": [{"required": ["text"]}, {"required": ["input_ids"]}],
        "properties": {
            "text": _one_or_many({"type": "string", "minLength": 1}),
            "input_ids": {"anyOf": [_tokens(b), {"type": "array", "items": _tokens(b), "minItems": 1}]},
            "sampling_params": _one_or_many(sampling_params(b)),
            "rid": _one_or_many(_STR),
            "stream": _BOOL,
            **{name: _one_or_many(key.schema(b)) for name, key in LOGPROB_FIELDS.items()},
            "return_text_in_logprobs": _BOOL,
            "lora_path": {"anyOf": [_STR, {"type": "array", "items": {"type": ["string", "null"]}, "minItems": 1}]},
        },
    }


_MESSAGE = {"type": "object", "required": ["role", "content"],
            "properties": {"role": {"enum": ["system", "user", "assistant", "tool"]}, "content": _STR}}


def _openai_sampling(b: Bounds) -> Schema:
    """The OpenAI routes' sampling fields: SGLang's keys under OpenAI's names
    (``chat_format.OPENAI_SAMPLING``), declared once in ``validation.SAMPLING``."""
    return {"model": _STR, "lora_path": _STR, "stream": _BOOL, "max_tokens": SAMPLING["max_new_tokens"].schema(b),
            "n": SAMPLING["n"].schema(b), "stop": SAMPLING["stop"].schema(b),
            **{name: SAMPLING[key].schema(b) for name, key in OPENAI_SAMPLING}}


def chat_completion(b: Bounds) -> Schema:
    """``/v1/chat/completions``' body (``n`` > 1 only without ``stream``)."""
    return {
        "type": "object",
        "required": ["messages"],
        "properties": {
            "messages": {"type": "array", "items": _MESSAGE, "minItems": 1},
            **_openai_sampling(b),
            "max_completion_tokens": SAMPLING["max_new_tokens"].schema(b),
            "logprobs": _BOOL,
            "top_logprobs": LOGPROB_FIELDS["top_logprobs_num"].schema(b),
            "tools": {"type": "array", "items": {"type": "object"}},
            "tool_choice": {"enum": ["auto", "none"]},
            "return_token_ids": _BOOL,
        },
    }


def completion(b: Bounds) -> Schema:
    """``/v1/completions``' body (no ``echo``, no ``stream``: refused)."""
    return {
        "type": "object",
        "required": ["prompt"],
        "properties": {"prompt": {"anyOf": [{"type": "string", "minLength": 1}, _tokens(b)]}, **_openai_sampling(b),
                       "stream": {"const": False}, "echo": {"const": False},
                       "logprobs": {**LOGPROB_FIELDS["top_logprobs_num"].schema(b), "type": ["integer", "null"]}},
    }

"""The request bodies of ``agentrl serve``'s routes as JSON Schema, for its OpenAPI document.

What it is: one schema per body (SGLang's ``GenerateReqInput`` and ``sampling_params``, the
OpenAI chat and completion requests, the control routes), attached to the routes with
``json_body(schema)`` so that ``GET /openapi.json`` describes what each route reads — for client
generators, and for the fuzz test that sends schema-shaped and schema-violating bodies to
every route (``tests/inference/test_fuzz.py``). The generation schemas carry the served
model's and the server's own bounds (``Bounds``: token ids below the vocabulary size,
``max_new_tokens`` within the context, the caps on ``n`` and top-logprobs), so a body drawn
from them is mostly one the engine runs.

What it is not: validation — the routes parse their bodies themselves (``wire``,
``validation``) and answer a 4xx naming the field, so the schemas describe the accepted
shapes without enforcing them (FastAPI's own 422 never fires). Some limits depend on several
fields at once (prompt + output within the context, one ``sampling_params`` per prompt of a
batch, ``logprob_start_len`` within the prompt) and are checked only there.
"""

from __future__ import annotations

from typing import Any

from agentrl.inference.validation import MAX_STOP, MAX_STREAM_INTERVAL, TOP_K_ALL, Bounds

Schema = dict[str, Any]


def _one_or_many(item: Schema) -> Schema:
    return {"anyOf": [item, {"type": "array", "items": item, "minItems": 1}]}


_NUM = {"type": "number"}
_BOOL = {"type": "boolean"}
_STR = {"type": "string"}
_STRINGS = {"anyOf": [_STR, {"type": "array", "items": _STR, "maxItems": MAX_STOP}, {"type": "null"}]}


def _tokens(b: Bounds) -> Schema:
    """A prompt as token ids: within the vocabulary, shorter than the context."""
    item: Schema = {"type": "integer", "minimum": 0}
    if b.vocab_size:
        item["maximum"] = b.vocab_size - 1
    return {"type": "array", "items": item, "minItems": 1, "maxItems": b.context_length - 1}


def _max_tokens(b: Bounds) -> Schema:
    return {"type": ["integer", "null"], "minimum": 0, "maximum": b.context_length - 1}


def sampling_params(b: Bounds) -> Schema:
    """SGLang's ``sampling_params`` (sglang 0.5.23 ``sampling_params.py``) within ``b``."""
    return {
        "type": "object",
        "properties": {
            "max_new_tokens": _max_tokens(b),
            "min_new_tokens": {"type": "integer", "minimum": 0, "maximum": b.context_length - 1},
            "temperature": {"type": "number", "minimum": 0},
            "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "top_k": {"anyOf": [{"const": -1}, {"type": "integer", "minimum": 1, "maximum": TOP_K_ALL}]},
            "min_p": {"type": "number", "minimum": 0, "maximum": 1},
            "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
            "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
            "repetition_penalty": {"type": "number", "exclusiveMinimum": 0, "maximum": 2},
            "stop": _STRINGS,
            "stop_regex": _STRINGS,
            "stop_token_ids": {"type": ["array", "null"], "items": {"type": "integer"}, "maxItems": 1024},
            "ignore_eos": _BOOL,
            "skip_special_tokens": _BOOL,
            "spaces_between_special_tokens": _BOOL,
            "no_stop_trim": _BOOL,
            "n": {"type": "integer", "minimum": 1, "maximum": b.max_n},
            "sampling_seed": {"type": ["integer", "null"], "minimum": -(1 << 63), "maximum": (1 << 64) - 1},
            "json_schema": {"type": "null"},
            "regex": {"type": "null"},
            "ebnf": {"type": "null"},
            "structural_tag": {"type": "null"},
            "logit_bias": {"type": ["object", "null"], "propertyNames": {"pattern": "^[0-9]+$"},
                           "additionalProperties": {"type": "number", "minimum": -1e6, "maximum": 1e6}},
            "stream_interval": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_STREAM_INTERVAL},
            "custom_params": {"type": ["object", "null"]},
        },
        "additionalProperties": False,
    }


def generate(b: Bounds) -> Schema:
    """``/generate``'s body (``GenerateReqInput``): exactly one of ``text`` and ``input_ids``,
    one prompt or a batch."""
    top = {"type": "integer", "minimum": 0, "maximum": b.max_top_logprobs}
    return {
        "type": "object",
        "oneOf": [{"required": ["text"]}, {"required": ["input_ids"]}],
        "properties": {
            "text": _one_or_many({"type": "string", "minLength": 1}),
            "input_ids": {"anyOf": [_tokens(b), {"type": "array", "items": _tokens(b), "minItems": 1}]},
            "sampling_params": _one_or_many(sampling_params(b)),
            "rid": _one_or_many(_STR),
            "stream": _BOOL,
            "return_logprob": _one_or_many(_BOOL),
            "logprob_start_len": _one_or_many({"type": "integer", "minimum": -1, "maximum": b.context_length - 1}),
            "top_logprobs_num": _one_or_many(top),
            "return_text_in_logprobs": _BOOL,
        },
    }


_MESSAGE = {"type": "object", "required": ["role", "content"],
            "properties": {"role": {"enum": ["system", "user", "assistant", "tool"]}, "content": _STR}}


def _openai_sampling(b: Bounds) -> Schema:
    return {
        "model": _STR, "max_tokens": _max_tokens(b), "temperature": {"type": "number", "minimum": 0},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "top_k": {"anyOf": [{"const": -1}, {"type": "integer", "minimum": 1, "maximum": TOP_K_ALL}]},
        "n": {"type": "integer", "minimum": 1, "maximum": b.max_n}, "stop": _STRINGS,
        "seed": {"type": "integer", "minimum": -(1 << 63), "maximum": (1 << 64) - 1}, "stream": _BOOL,
        "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
        "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
        "repetition_penalty": {"type": "number", "exclusiveMinimum": 0, "maximum": 2},
        "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    }


def chat_completion(b: Bounds) -> Schema:
    """``/v1/chat/completions``' body (``n`` > 1 only without ``stream``)."""
    return {
        "type": "object",
        "required": ["messages"],
        "properties": {
            "messages": {"type": "array", "items": _MESSAGE, "minItems": 1},
            **_openai_sampling(b),
            "max_completion_tokens": _max_tokens(b),
            "logprobs": _BOOL,
            "top_logprobs": {"type": "integer", "minimum": 0, "maximum": b.max_top_logprobs},
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
                       "logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": b.max_top_logprobs}},
    }


PAUSE: Schema = {"type": "object", "properties": {"mode": {"enum": ["abort", "retract", "in_place"]}}}
CONTINUE: Schema = {"type": "object"}
ABORT: Schema = {"type": "object", "properties": {"rid": _STR, "abort_all": _BOOL}}
UPDATE_FROM_DISK: Schema = {
    "type": "object",
    "required": ["model_path"],
    "properties": {"model_path": {"type": "string", "minLength": 1}, "weight_version": {"type": ["string", "null"]},
                   "abort_all_requests": _BOOL, "flush_cache": _BOOL, "load_format": {"type": ["string", "null"]}},
}
UPDATE_VERSION: Schema = {"type": "object", "required": ["new_version"],
                          "properties": {"new_version": {"type": "string", "minLength": 1},
                                         "abort_all_requests": _BOOL}}


def json_body(schema: Schema, required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` for a route that reads a JSON body of ``schema``."""
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": schema}}}}

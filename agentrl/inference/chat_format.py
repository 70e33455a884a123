"""The OpenAI chat-completions format, shared by ``agentrl serve`` and the rollout gateway.

What it is: the pieces of ``/v1/chat/completions`` that do not depend on who generates —
reading a request (messages, tools and ``tool_choice`` checked, the sampling fields mapped to
SGLang's ``sampling_params``), and shaping an answer (the assistant message with its
``tool_calls`` parsed by ``agentrl.toolcalls``, per-token ``logprobs``, ``usage``, stream
chunks as server-sent events), following SGLang 0.5.23's ``entrypoints/openai/protocol.py``
and ``serving_chat.py``. Every refusal is a ``Refused`` naming the field. What it is not:
rendering or generation (``openai_routes`` over the engine; ``agentrl.rollout.chat_client``
over any ``InferenceClient``). Imports no torch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.errors import Refused
from agentrl.toolcalls import DEFAULT_TOOL_PARSER, parse

ROLES = ("system", "user", "assistant", "tool", "developer")
TEXT_PARTS = ("text", "input_text", "output_text")
"""The content part kinds that hold text (Chat Completions' and the Responses API's)."""

OPENAI_SAMPLING = (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"),
                    ("stop_token_ids", "stop_token_ids"), ("ignore_eos", "ignore_eos"), ("seed", "sampling_seed"),
                    ("skip_special_tokens", "skip_special_tokens"), ("no_stop_trim", "no_stop_trim"),
                    ("frequency_penalty", "frequency_penalty"), ("presence_penalty", "presence_penalty"),
                    ("repetition_penalty", "repetition_penalty"), ("min_p", "min_p"), ("logit_bias", "logit_bias"))
"""OpenAI request field -> SGLang ``sampling_params`` key (besides max_tokens, n and stop)."""


def sampling_fields(body: dict[str, Any], default_max: int | None) -> dict[str, Any]:
    """OpenAI request fields -> a SGLang ``sampling_params`` object (checked by ``wire.parse_sampling``)."""
    sp: dict[str, Any] = {"max_new_tokens": body.get("max_completion_tokens", body.get("max_tokens", default_max))}
    for src, dst in OPENAI_SAMPLING:
        if body.get(src) is not None:
            sp[dst] = body[src]
    if body.get("stop") is not None:
        sp["stop"] = body["stop"]
    return sp


def chat_request(body: dict[str, Any], *, server: str = "agentrl serve") -> tuple[list[dict], list[dict] | None, bool]:
    """Check a chat request's ``messages``, ``tools`` and ``tool_choice``.

    Returns (messages, tools, use_tools): tools are rendered and calls parsed only when
    ``use_tools`` (tools given and ``tool_choice`` is ``"auto"``)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise Refused("messages must be a non-empty list of {\"role\": ..., \"content\": ...} objects")
    for i, m in enumerate(messages):
        if m.get("role") not in ROLES:
            raise Refused(f"messages[{i}].role must be system, user, assistant or tool, got {m.get('role')!r}")
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise Refused("tools must be a list of {\"type\": \"function\", \"function\": {...}} objects")
    choice = body.get("tool_choice", "auto" if tools else "none")
    if choice not in ("auto", "none"):
        raise Refused(f"tool_choice {choice!r} is not supported by {server}; use \"auto\" or \"none\"")
    use_tools = bool(tools) and choice == "auto"
    return messages, tools if use_tools else None, use_tools


def plain_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the chat template takes them: OpenAI's text content parts (``[{"type": "text",
    "text": ...}]``) joined into one string; a part of another kind is refused (400)."""
    out = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") in TEXT_PARTS and isinstance(part.get("text"), str)):
                    raise Refused(f"messages[{i}].content: only text parts are supported, got {str(part)[:80]}")
                texts.append(part["text"])
            m = {**m, "content": "".join(texts)}
        elif content is not None and not isinstance(content, str):
            raise Refused(f"messages[{i}].content must be a string or a list of text parts, "
                             f"got {type(content).__name__}")
        out.append(m)
    return out


def keep_special_tokens(body: dict[str, Any], tool_parser: str, reasoning_parser: str | None) -> None:
    """Decode the answer with its special tokens when it is read in another family's format
    (their markers — ``<|python_tag|>``, DeepSeek's and Kimi's, gpt-oss's channels — are special
    tokens) unless the request set ``skip_special_tokens`` itself. The default reading (``qwen25``,
    no reasoning) changes nothing."""
    if (tool_parser != DEFAULT_TOOL_PARSER or reasoning_parser is not None) and "skip_special_tokens" not in body:
        body["skip_special_tokens"] = False


def assistant_message(text: str, use_tools: bool, finish: str, matched: int | str | None, *,
                      tool_parser: str = DEFAULT_TOOL_PARSER, reasoning_parser: str | None = None,
                      tools: list[dict[str, Any]] | None = None) -> tuple[dict[str, Any], str, int | str | None]:
    """The answer's ``message`` and its (finish_reason, matched_stop), read by ``agentrl.toolcalls.parse``.

    With a reasoning parser the reasoning goes to ``reasoning_content`` and the rest to
    ``content``; with tools on, the well-formed calls of ``tool_parser``'s format become
    ``tool_calls`` (never one written in the reasoning) and a stop becomes ``"tool_calls"``.
    Without either, ``content`` is the text unchanged."""
    message: dict[str, Any] = {"role": "assistant", "content": text, "reasoning_content": None}
    if not use_tools and reasoning_parser is None:
        return message, finish, matched
    parsed = parse(text, tool_parser, reasoning_parser, tools)
    if reasoning_parser is not None:
        message["reasoning_content"] = parsed.reasoning
        message["content"] = parsed.content
    if use_tools and parsed.tool_calls:
        message["content"] = parsed.content
        message["tool_calls"] = [c.to_openai(j) for j, c in enumerate(parsed.tool_calls)]
        if finish == "stop":
            finish, matched = "tool_calls", None
    return message, finish, matched


def token_logprobs(decode_one: Callable[[int], str], ids: Sequence[int], logprobs: Sequence[float],
                   top: Sequence[Sequence[tuple[float, int]]] | None = None) -> dict[str, Any]:
    """``choices[i].logprobs``: one entry per output token (``top``: (logprob, id) pairs per token)."""
    content = []
    for i, (tok, lp) in enumerate(zip(ids, logprobs, strict=True)):
        text = decode_one(tok)
        tops = [{"token": (t := decode_one(tid)), "bytes": list(t.encode()), "logprob": v}
                for v, tid in (top[i] if top else ())]
        content.append({"token": text, "bytes": list(text.encode()), "logprob": lp, "top_logprobs": tops})
    return {"content": content}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "reasoning_tokens": 0}


def sse(obj: dict[str, Any] | str) -> str:
    """One server-sent event (``[DONE]`` is sent as the string itself)."""
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


def chunk(base: dict[str, Any], delta: dict[str, Any], finish: str | None = None, matched: int | str | None = None,
          logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk`` with a single choice; ``base`` holds id, created and model."""
    return {**base, "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish,
                         "matched_stop": matched}]}


def answer_chunks(answer: dict[str, Any], *, include_usage: bool = False) -> list[dict[str, Any]]:
    """A finished ``chat.completion`` (one choice) as its stream of chunks: the role, one delta
    with the content and tool calls (and their logprobs), the finish reason, then the usage
    when ``stream_options.include_usage`` asked for it."""
    base = {"id": answer["id"], "created": answer["created"], "model": answer["model"]}
    choice = answer["choices"][0]
    message = choice["message"]
    out = [chunk(base, {"role": "assistant", "content": ""})]
    delta = {k: message[k] for k in ("reasoning_content", "content", "tool_calls") if message.get(k)}
    if delta or choice.get("logprobs"):
        out.append(chunk(base, delta, logprobs=choice.get("logprobs")))
    out.append(chunk(base, {}, choice["finish_reason"], choice.get("matched_stop")))
    if include_usage:
        out.append({**base, "object": "chat.completion.chunk", "choices": [], "usage": answer["usage"]})
    return out

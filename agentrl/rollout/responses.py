"""The Responses API's basic shape, mapped onto chat completions (what the OpenAI Agents SDK calls).

What it is: ``chat_body(request)`` turns a ``POST /v1/responses`` body — ``instructions``,
``input`` as a string or a list of items (messages with text parts, ``function_call`` and
``function_call_output`` items), function ``tools``, ``tool_choice``, ``temperature``,
``top_p``, ``max_output_tokens`` — into the chat-completions body the chat client runs;
``response_from_chat(answer, request)`` turns the chat answer back into a ``response`` object
whose ``output`` holds an assistant ``message`` item (the text) and one ``function_call``
item per tool call. Consecutive assistant text and function calls in the input become one
assistant message with ``tool_calls``, which is how the model wrote them, so the rendering
extends the recorded tokens exactly.

What it is not: the stateful parts (``previous_response_id``, ``conversation``, stored
prompts), hosted tools (web search, file search...), structured output, streaming events
(``stream=true``); reasoning items from other models are skipped. Each refused one is a 400
that names it.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from agentrl.errors import Refused

_REFUSED = ("previous_response_id", "conversation", "prompt")
_TEXT_PARTS = ("input_text", "output_text", "text")


def chat_body(request: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions body for a Responses API request."""
    for name in _REFUSED:
        if request.get(name) not in (None, ""):
            raise Refused(f"{name} is not supported by agentrl's Responses API: it keeps no state between "
                             "calls; send the whole conversation as input")
    if request.get("stream"):
        raise Refused("stream=true is not supported on the Responses API here; use /v1/chat/completions "
                         "with stream=true, or stream=false")
    if request.get("top_logprobs"):
        raise Refused("top_logprobs is not supported: the engine returns the sampled token's logprob only")
    fmt = (request.get("text") or {}).get("format") if isinstance(request.get("text"), dict) else None
    if fmt is not None and fmt.get("type") != "text":
        raise Refused("text.format other than {\"type\": \"text\"} (structured output) is not supported")
    messages: list[dict[str, Any]] = []
    if request.get("instructions"):
        if not isinstance(request["instructions"], str):
            raise Refused("instructions must be a string")
        messages.append({"role": "system", "content": request["instructions"]})
    messages += _messages(request.get("input"))
    body: dict[str, Any] = {"model": request.get("model"), "messages": messages}
    if request.get("tools"):
        body["tools"] = _tools(request["tools"])
    for src, dst in (("tool_choice", "tool_choice"), ("temperature", "temperature"), ("top_p", "top_p"),
                     ("max_output_tokens", "max_tokens"), ("seed", "seed"), ("top_k", "top_k")):
        if request.get(src) is not None:
            body[dst] = request[src]
    include = request.get("include") or []
    if not isinstance(include, list):
        raise Refused("include must be a list of strings")
    body["logprobs"] = "message.output_text.logprobs" in include
    return body


def response_from_chat(answer: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """The ``response`` object for a chat answer to ``chat_body(request)``."""
    choice = answer["choices"][0]
    message = choice["message"]
    output: list[dict[str, Any]] = []
    if message.get("content"):
        part: dict[str, Any] = {"type": "output_text", "text": message["content"], "annotations": []}
        if choice.get("logprobs"):
            part["logprobs"] = [{**c, "top_logprobs": []} for c in choice["logprobs"]["content"]]
        output.append({"type": "message", "id": f"msg_{uuid.uuid4().hex}", "role": "assistant",
                       "status": "completed", "content": [part]})
    for call in message.get("tool_calls") or ():
        output.append({"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"],
                       "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                       "status": "completed"})
    cut = choice["finish_reason"] == "length"
    u = answer["usage"]
    return {
        "id": response_id(answer["id"]), "object": "response", "created_at": answer["created"],
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "error": None,
        "model": answer["model"], "output": output, "instructions": request.get("instructions"),
        "tools": request.get("tools") or [], "tool_choice": request.get("tool_choice", "auto"),
        "parallel_tool_calls": bool(request.get("parallel_tool_calls", True)),
        "temperature": request.get("temperature"), "top_p": request.get("top_p"),
        "max_output_tokens": request.get("max_output_tokens"), "metadata": request.get("metadata") or {},
        "text": {"format": {"type": "text"}},
        "usage": {"input_tokens": u["prompt_tokens"], "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                  "output_tokens": u["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": u["total_tokens"]},
    }


def response_id(completion_id: str) -> str:
    """The response id of a chat completion id (both name the same recorded call)."""
    return "resp_" + completion_id.removeprefix("chatcmpl-")


def _messages(items: Any) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise Refused("input must be a string or a list of items")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise Refused(f"input[{i}] must be an object, got {type(item).__name__}")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise Refused(f"input[{i}].role must be user, assistant, system or developer, got {role!r}")
            text = _text(item.get("content"), f"input[{i}].content")
            out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            call = {"id": item.get("call_id") or item.get("id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}
            if not isinstance(call["function"]["name"], str) or not isinstance(call["function"]["arguments"], str):
                raise Refused(f"input[{i}]: a function_call needs a string name and string arguments")
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)  # text and calls of one answer: one message
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else _text(output, f"input[{i}].output")
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": content})
        elif kind == "reasoning":
            continue  # another model's reasoning summary: not part of this model's conversation
        else:
            raise Refused(f"input[{i}].type {kind!r} is not supported; use message, function_call or "
                             "function_call_output items")
    if not out:
        raise Refused("input holds no message")
    return out


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        bad = [p.get("type") for p in content if p.get("type") not in _TEXT_PARTS]
        if bad:
            raise Refused(f"{where}: only text parts are supported, got {bad[0]!r}")
        return "".join(str(p.get("text", "")) for p in content)
    raise Refused(f"{where} must be a string or a list of text parts")


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise Refused("tools must be a list")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("name"), str):
            raise Refused(f"tools[{i}]: only function tools are supported ({{\"type\": \"function\", \"name\": "
                             f"...}}), got {json.dumps(t)[:100]}")
        fn = {"name": t["name"], "parameters": t.get("parameters") or {"type": "object", "properties": {}}}
        if t.get("description"):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out

"""Runs SGLang's or vLLM's own parsers over a corpus: JSON cases on stdin, JSON results on stdout.

Run by ``tests/toolcalls/references.py`` in a subprocess, one process for the whole corpus:
``python reference_runner.py sglang`` with the sglang wheel (``make sglang-frontend``) on
PYTHONPATH, ``.venv-vllm/bin/python reference_runner.py vllm`` in vLLM's environment (its pins
differ from ours). The parser classes are the packages' own, unmodified; each reply goes
through the reasoning parser first (when the case names one), then the tool parser reads the
normal text — the order both servers use. vLLM's parsers want a tokenizer only to look up
their special tokens' ids, so they get a stand-in whose vocabulary holds those tokens.

A case: {"id", "tool_parser", "reasoning_parser" (ours names, or null), "text", "tools", and
"stream": true to feed SGLang's streaming parsers one character at a time}.
A result: {"id", "status": "ok" | "raised" | "none", "content", "reasoning", "calls": [{"name",
"arguments"}], "detail"}; "none" when the engine has no text parser of that name.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback

logging.disable(logging.CRITICAL)

# ours -> the engine's name (None: the engine has no parser of this format that reads text)
SGLANG_TOOL = {"qwen25": "qwen25", "hermes": "hermes", "qwen3_coder": "qwen3_coder", "llama3": "llama3",
               "mistral": "mistral", "deepseekv3": "deepseekv3", "deepseekv31": "deepseekv31",
               "kimi_k2": "kimi_k2", "glm45": "glm45", "gpt-oss": "gpt-oss", "pythonic": "pythonic"}
SGLANG_REASONING = {"deepseek-r1": "deepseek-r1", "qwen3": "qwen3", "kimi": "kimi", "gpt-oss": "gpt-oss"}
# vLLM's gpt-oss parsers are stubs that point to openai_harmony's token-id parser (no text parser);
# vLLM has no parser of Kimi-VL's ◁think▷ tags (its kimi_k2 reads <think>).
VLLM_TOOL = {"qwen25": "hermes", "hermes": "hermes", "qwen3_coder": "qwen3_coder", "llama3": "llama3_json",
             "mistral": "mistral", "deepseekv3": "deepseek_v3", "deepseekv31": "deepseek_v31",
             "kimi_k2": "kimi_k2", "glm45": "glm45", "gpt-oss": None, "pythonic": "pythonic"}
VLLM_REASONING = {"deepseek-r1": "deepseek_r1", "qwen3": "qwen3", "kimi": None, "gpt-oss": None}

SPECIAL_TOKENS = [
    "<tool_call>", "</tool_call>", "<think>", "</think>", "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]",
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
    "<|tool_call_end|>", "<|tool_call_argument_begin|>", "<arg_key>", "</arg_key>", "<arg_value>",
    "</arg_value>", "◁think▷", "◁/think▷", "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>",
    "<|return|>", "<|constrain|>", "<|eom_id|>", "<|eot_id|>", "<function=", "</function>",
    "<parameter=", "</parameter>",
]


# markers a tokenizer spells out in several tokens (the others are one special token each)
_SPELLED_OUT = ("<function=", "</function>", "<parameter=", "</parameter>")


def stream_pieces(text: str) -> list[str]:
    """The text split as a token stream would reach a streaming parser: every special token of
    ``SPECIAL_TOKENS`` whole (SGLang's streaming detectors expect them so), other text one
    character at a time."""
    pieces, pos = [], 0
    while pos < len(text):
        special = next((t for t in SPECIAL_TOKENS if t not in _SPELLED_OUT and text.startswith(t, pos)), None)
        pieces.append(special or text[pos])
        pos += len(pieces[-1])
    return pieces


class StandInTokenizer:
    """What vLLM's parsers ask of a tokenizer here: the ids of their special tokens."""

    def __init__(self):
        self._vocab = {tok: 1000 + i for i, tok in enumerate(SPECIAL_TOKENS)}
        self.vocab = self._vocab
        self.name_or_path = "stand-in"

    def get_vocab(self):
        return dict(self._vocab)

    def encode(self, text, add_special_tokens=False):
        return [self._vocab.get(text, 0)]

    def decode(self, ids, **_):
        inverse = {v: k for k, v in self._vocab.items()}
        return "".join(inverse.get(i, "") for i in ids)

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return self._vocab.get(tokens)
        return [self._vocab.get(t) for t in tokens]


def arguments(raw: str):
    """A reference may hand on arguments that are not JSON (from a malformed call): kept as text."""
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        return {"<not JSON>": raw}


def sglang_engine():
    from sglang.srt.entrypoints.openai.protocol import Tool
    from sglang.srt.function_call.function_call_parser import FunctionCallParser
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    def run(case):
        tool_name = SGLANG_TOOL.get(case["tool_parser"])
        reasoning_name = SGLANG_REASONING.get(case["reasoning_parser"]) if case["reasoning_parser"] else None
        if tool_name is None or (case["reasoning_parser"] and reasoning_name is None):
            return {"status": "none"}
        tools = [Tool(**t) for t in case["tools"]]
        detector = FunctionCallParser.ToolCallParserEnum[tool_name]()
        if case.get("stream"):
            return sglang_stream(case, reasoning_name, detector, tools)
        reasoning, normal = None, case["text"]
        if reasoning_name:
            reasoning, normal = ReasoningParser(model_type=reasoning_name, stream_reasoning=False).parse_non_stream(normal)
        result = detector.detect_and_parse(normal or "", tools)
        calls = [{"name": c.name, "arguments": arguments(c.parameters)} for c in result.calls]
        return {"status": "ok", "content": result.normal_text, "reasoning": reasoning, "calls": calls}

    def sglang_stream(case, reasoning_name, detector, tools):
        """The reply fed in ``stream_pieces``, as SGLang's server feeds its deltas."""
        reasoner = ReasoningParser(model_type=reasoning_name, stream_reasoning=True) if reasoning_name else None
        reasoning, content, calls = "", "", {}

        def take(result):
            nonlocal content
            content += result.normal_text or ""
            for item in result.calls:
                call = calls.setdefault(item.tool_index, {"name": None, "arguments": ""})
                call["name"] = item.name or call["name"]
                call["arguments"] += item.parameters or ""

        for ch in stream_pieces(case["text"]):
            normal = ch
            if reasoner is not None:
                r, normal = reasoner.parse_stream_chunk(ch)
                reasoning += r or ""
            if normal:
                take(detector.parse_streaming_increment(normal, tools))
        if reasoner is not None:
            r, normal = reasoner.parse_stream_end()
            reasoning += r or ""
            if normal:
                take(detector.parse_streaming_increment(normal, tools))
        take(detector.finish(tools))
        return {"status": "ok", "content": content, "reasoning": reasoning or None,
                "calls": [{"name": c["name"], "arguments": arguments(c["arguments"] or "{}")}
                          for _, c in sorted(calls.items())]}

    return run


def vllm_engine():
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    tokenizer = StandInTokenizer()

    def run(case):
        tool_name = VLLM_TOOL.get(case["tool_parser"])
        reasoning_name = VLLM_REASONING.get(case["reasoning_parser"]) if case["reasoning_parser"] else None
        if tool_name is None or (case["reasoning_parser"] and reasoning_name is None) or case.get("stream"):
            return {"status": "none"}  # vLLM's streaming parsers read token ids as well as text
        request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}],
                                        tools=case["tools"] or None)
        reasoning, normal = None, case["text"]
        if reasoning_name:
            parser = ReasoningParserManager.get_reasoning_parser(reasoning_name)(tokenizer)
            reasoning, normal = parser.extract_reasoning(normal, request)
        parser = ToolParserManager.get_tool_parser(tool_name)(tokenizer)
        info = parser.extract_tool_calls(normal or "", request)
        calls = [{"name": c.function.name, "arguments": arguments(c.function.arguments)} for c in info.tool_calls]
        return {"status": "ok", "content": info.content, "reasoning": reasoning, "calls": calls}

    return run


def main() -> None:
    run = {"sglang": sglang_engine, "vllm": vllm_engine}[sys.argv[1]]()
    results = []
    for case in json.load(sys.stdin):
        try:
            out = run(case)
        except Exception as e:  # a reference that raises is a result too
            out = {"status": "raised", "detail": f"{type(e).__name__}: {e}"[:300],
                   "trace": traceback.format_exc()[-600:]}
        results.append({"id": case["id"], **out})
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()

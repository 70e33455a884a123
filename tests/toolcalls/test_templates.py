"""Chat templates of eight model families (``templates/``), multi-turn, with tools and reasoning.

For each family: every assistant turn, as its template renders it, is read back by our parser
of that family (the calls, content and reasoning it was rendered from), and the conversation
built call by call (as the ``ChatClient`` and ``EnvWorkflow`` build it) is exact where the
template keeps history, and splits into segments exactly where the template rewrites it —
``check_token_drift`` says where.

The bug stories: a template and a parser that disagree on a family's call format (calls the
model writes and nobody runs, or history the model never wrote); a template that rewrites
history (Qwen3's and GLM-4.5's dropped reasoning, DeepSeek's, gpt-oss's ``<|return|>`` →
``<|end|>``, Mistral's moving tool list) trained as one stream with tokens the model never saw.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from agentrl.rollout.drift import check_token_drift
from agentrl.rollout.renderer import ChatRenderer
from agentrl.toolcalls import parse

from .corpus import TOOLS

TEMPLATES = Path(__file__).parent / "templates"


class Family:
    def __init__(self, template: str, tool_parser: str, reasoning_parser: str | None, stop: str,
                 markers: list[str], *, content_with_calls: bool = True, one_call: bool = False,
                 kwargs: dict[str, Any] | None = None) -> None:
        self.template, self.tool_parser, self.reasoning_parser = template, tool_parser, reasoning_parser
        self.stop, self.markers, self.content_with_calls, self.one_call = stop, markers, content_with_calls, one_call
        self.kwargs = kwargs or {}


QWEN = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
DEEPSEEK = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
            "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
            "<｜tool▁sep｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"]
FAMILIES = {
    "qwen25": Family("qwen25", "qwen25", None, "<|im_end|>", QWEN),
    "qwen3": Family("qwen3", "qwen25", "qwen3", "<|im_end|>", QWEN + ["<think>", "</think>"]),
    "llama3": Family("llama3", "llama3", None, "<|eot_id|>",
                     ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                      "<|python_tag|>"], content_with_calls=False),
    "mistral": Family("mistral", "mistral", None, "</s>",
                      ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[ARGS]", "[AVAILABLE_TOOLS]",
                       "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]",
                       "[/SYSTEM_PROMPT]"]),
    "deepseekv31": Family("deepseekv31", "deepseekv31", "deepseek-r1", "<｜end▁of▁sentence｜>", DEEPSEEK,
                          kwargs={"thinking": True}),
    "kimi_k2": Family("kimi_k2", "kimi_k2", None, "<|im_end|>",
                      ["<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
                       "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                       "<|tool_call_argument_begin|>", "<|tool_call_end|>"]),
    "glm45": Family("glm45", "glm45", "qwen3", "<|user|>",
                    ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<think>",
                     "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
                     "</arg_value>", "<tool_response>", "</tool_response>"]),
    "gpt-oss": Family("gpt-oss", "gpt-oss", "gpt-oss", "<|return|>",
                      ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>",
                       "<|return|>"], content_with_calls=False, one_call=True),
}
# Where the conversation below splits (indices of the assistant messages whose call starts a new
# segment; len(messages) = the final prompt): what each template does to history.
BREAKS = {
    "qwen25": [], "llama3": [], "kimi_k2": [],
    "qwen3": [7], "glm45": [7],  # the reasoning of turns before the second question is dropped
    "mistral": [7],  # the tool list moves to the second question
    "gpt-oss": [6],  # the first answer's <|return|> becomes <|end|> and its analysis is dropped
    "deepseekv31": [5, 7, 9],  # every earlier turn loses its reasoning
}


def call(i: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": arguments}}


def conversation(family: Family) -> list[dict[str, Any]]:
    """A system prompt, two questions, a turn with calls (two, unless the family writes one per
    turn), tool results, answers — with unicode, nested and typed arguments, reasoning on every
    assistant turn for the families that reason."""
    think = family.reasoning_parser is not None
    first = [call(0, "get_weather", {"city": "Zürich", "days": 2, "metric": True}),
             call(1, "search_docs", {"query": "東京 タワー \"hi\"", "filters": {"lang": ["ja", "en"], "n": {"k": -3}},
                                     "limit": 3})]
    if family.one_call:
        first = first[:1]
    ids = [f"functions.{c['function']['name']}:{k}" if family.template == "kimi_k2" else c["id"]
           for k, c in enumerate(first)]
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Weather in Zürich, and the docs on Tokyo Tower?"},
        {"role": "assistant", "content": "Let me look both up." if family.content_with_calls else "",
         "tool_calls": first},
    ]
    results = ['{"temp_c": 21}', "3 pages"][: len(ids)]
    msgs += [{"role": "tool", "tool_call_id": i, "content": r} for i, r in zip(ids, results, strict=True)]
    msgs += [{"role": "assistant", "content": "21 °C in Zürich; the docs have 3 pages."},
             {"role": "user", "content": "And in two days?"},
             {"role": "assistant", "content": "", "tool_calls": [call(2, "ping", {})]}]
    last_id = "functions.ping:2" if family.template == "kimi_k2" else "call_2"
    msgs += [{"role": "tool", "tool_call_id": last_id, "content": "pong"},
             {"role": "assistant", "content": "Still 21 °C."}]
    if think:
        for k, m in enumerate(m for m in msgs if m["role"] == "assistant"):
            m["reasoning_content"] = ["The user wants two lookups.", "Both results are in.", "One more call.",
                                      "考虑一下: still warm."][k]
    return msgs


def renderer_for(family: Family, tiny_model_dir: Path) -> ChatRenderer:
    from transformers import AutoTokenizer

    tokenizer = copy.deepcopy(AutoTokenizer.from_pretrained(str(tiny_model_dir)))
    tokenizer.add_special_tokens({"additional_special_tokens": family.markers})
    tokenizer.eos_token = family.stop
    tokenizer.chat_template = (TEMPLATES / f"{family.template}.jinja").read_text()
    return ChatRenderer(tokenizer, chat_template_kwargs=family.kwargs)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_assistant_turn_reads_back_with_the_familys_parser(name, tiny_model_dir):
    family = FAMILIES[name]
    renderer = renderer_for(family, tiny_model_dir)
    messages = conversation(family)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    assert len(turns) == 4
    for i in turns:
        prompt = renderer.render(messages[:i], TOOLS)
        whole = renderer.render(messages[: i + 1], TOOLS, add_generation_prompt=False)
        assert whole.startswith(prompt), (name, i, prompt[-80:], whole[len(prompt) - 80:])
        written = whole[len(prompt):].split(family.stop)[0]  # what the model writes, up to its stop token
        ids = renderer.encode(written)
        assert renderer.decode(ids) == written  # the family's markers are single special tokens here
        assert all(renderer.encode(m) and len(renderer.encode(m)) == 1 for m in family.markers)
        out = parse(written, tool_parser=family.tool_parser, reasoning_parser=family.reasoning_parser, tools=TOOLS)
        m = messages[i]
        assert not out.errors, (name, i, written, out.errors)
        assert [(c.name, c.arguments) for c in out.tool_calls] == \
            [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls", [])], (name, i, written)
        assert out.content.strip() == m["content"], (name, i, written, out.content)
        assert (out.reasoning or None) == m.get("reasoning_content"), (name, i, written, out.reasoning)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_token_stream_splits_exactly_where_the_template_rewrites_history(name, tiny_model_dir):
    family = FAMILIES[name]
    renderer = renderer_for(family, tiny_model_dir)
    messages = conversation(family)
    report = check_token_drift(renderer, messages, TOOLS)
    assert report.breaks == BREAKS[name], (name, str(report))
    assert report.segments == len(BREAKS[name]) + 1
    if not BREAKS[name]:  # kept history: turn by turn is token for token the whole rendering
        assert report.equal and report.incremental_ids == report.full_ids, str(report)
    else:  # the first segment is exact up to where the template rewrote what was sampled
        first = report.first_difference
        assert first is not None and report.incremental_ids[:first] == report.full_ids[:first]

"""The conformance corpus: model replies in each family's format, generated from a seed.

Each case is a reply written the way the family's model writes it (rendered from a known
content, reasoning and list of calls, so the truth is known) in one of these kinds:
- ``well_formed``: 0-3 calls with nested, unicode and typed arguments, with or without
  content before the calls and reasoning before that;
- ``in_reasoning``: a call written inside closed reasoning (it must not run);
- ``opened_in_prompt``: reasoning whose start tag the chat template wrote (Qwen3-2507 thinking
  models): the reply only closes it;
- ``truncated``: a well-formed reply with calls cut at a random character;
- ``malformed``: a call with broken JSON (or broken tags) or to a tool that was not offered;
- ``trailing``: text after the calls;
- ``streamed``: the first well-formed replies again, read as a stream (special tokens whole,
  other text a character at a time) by ours and by SGLang's streaming parsers.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace
from typing import Any

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                         "metric": {"type": "boolean"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "search_docs", "description": "Search.", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}, "filters": {"type": "object"},
                                         "limit": {"type": "integer"}}, "required": ["query"]}}},
    {"type": "function", "function": {"name": "set_plan", "description": "Plan steps.", "parameters": {
        "type": "object", "properties": {"steps": {"type": "array"}, "ratio": {"type": "number"},
                                         "owner": {"type": "string"}}, "required": ["steps"]}}},
    {"type": "function", "function": {"name": "ping", "description": "No arguments.", "parameters": {
        "type": "object", "properties": {}}}},
]
WORDS = ["Paris", "東京", "Zürich", "naïve café", "emoji 🚀", "O'Brien", 'say "hi"', "back\\slash", "a, b; c",
         "tab\there", "mañana", "Ω ≈ 3", "x < y > z", "100%", "über-fast", "東京 タワー", "ok"]
SENTENCES = ["Let me check that for you.", "I will look this up.", "Voilà — une réponse.", "我来查一下。",
             "Checking the docs first 🙂", "The answer needs two lookups.", "Hmm, the user wants data."]
THOUGHTS = ["The user asks for the weather; I need a tool.", "Let me think: 2 + 2 = 4.",
            "考虑一下这个问题。", "Maybe search first, then plan.", "Ünïcödé thoughts, step by step."]


@dataclass
class Call:
    name: str
    arguments: dict[str, Any]


@dataclass
class Case:
    id: str
    tool_parser: str
    reasoning_parser: str | None
    kind: str
    text: str
    content: str = ""
    reasoning: str | None = None
    calls: list[Call] = field(default_factory=list)
    stream: bool = False  # read as a stream: special tokens whole, other text a character at a time

    def to_request(self) -> dict:
        return {"id": self.id, "tool_parser": self.tool_parser, "reasoning_parser": self.reasoning_parser,
                "text": self.text, "tools": TOOLS, "stream": self.stream}


def _value(rng: random.Random, kind: str, depth: int = 0) -> Any:
    if kind == "string":
        return " ".join(rng.sample(WORDS, rng.randint(1, 3)))
    if kind == "integer":
        return rng.choice([0, 1, 7, 42, -3, 10**6])
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "number":
        return rng.choice([0.5, 2.25, -1.5, 3.75])
    if kind == "array":
        return [_value(rng, rng.choice(["string", "integer", "object"]), depth + 1) for _ in range(rng.randint(0, 3))]
    if depth > 2:
        return {"leaf": _value(rng, "string", depth + 1)}
    return {rng.choice(["lang", "tags", "ünits", "since"]) + str(i): _value(rng, rng.choice(["string", "integer", "array", "object"]), depth + 1)
            for i in range(rng.randint(1, 3))}


def random_call(rng: random.Random) -> Call:
    tool = rng.choice(TOOLS)["function"]
    props = tool["parameters"]["properties"]
    args = {}
    for key, schema in props.items():
        if key in tool["parameters"].get("required", []) or rng.random() < 0.6:
            args[key] = _value(rng, schema["type"])
    return Call(tool["name"], args)


# --- how each family writes calls -------------------------------------------------------------

def _j(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _text_value(value: Any) -> str:
    return value if isinstance(value, str) else _j(value)


def render_calls(tool_parser: str, calls: list[Call]) -> str:
    if tool_parser in ("qwen25", "hermes"):
        return "\n".join(f'<tool_call>\n{_j({"name": c.name, "arguments": c.arguments})}\n</tool_call>' for c in calls)
    if tool_parser == "qwen3_coder":
        return "\n".join(
            f"<tool_call>\n<function={c.name}>\n"
            + "".join(f"<parameter={k}>\n{_text_value(v)}\n</parameter>\n" for k, v in c.arguments.items())
            + "</function>\n</tool_call>" for c in calls)
    if tool_parser == "llama3":
        return "<|python_tag|>" + "; ".join(_j({"name": c.name, "parameters": c.arguments}) for c in calls)
    if tool_parser == "mistral":  # the compact form of newer templates, or v0.3's JSON array
        if calls[0].name in ("get_weather", "ping"):
            return "".join(f"[TOOL_CALLS]{c.name}[ARGS]{_j(c.arguments)}" for c in calls)
        return "[TOOL_CALLS] " + _j([{"name": c.name, "arguments": c.arguments} for c in calls])
    if tool_parser == "deepseekv3":
        return ("<｜tool▁calls▁begin｜>" + "\n".join(
            f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{c.name}\n```json\n{_j(c.arguments)}\n```<｜tool▁call▁end｜>"
            for c in calls) + "<｜tool▁calls▁end｜>")
    if tool_parser == "deepseekv31":
        return ("<｜tool▁calls▁begin｜>" + "".join(
            f"<｜tool▁call▁begin｜>{c.name}<｜tool▁sep｜>{_j(c.arguments)}<｜tool▁call▁end｜>" for c in calls)
            + "<｜tool▁calls▁end｜>")
    if tool_parser == "kimi_k2":
        return ("<|tool_calls_section_begin|>" + "".join(
            f"<|tool_call_begin|>functions.{c.name}:{i}<|tool_call_argument_begin|>{_j(c.arguments)}<|tool_call_end|>"
            for i, c in enumerate(calls)) + "<|tool_calls_section_end|>")
    if tool_parser == "glm45":
        return "\n".join(
            f"<tool_call>{c.name}\n"
            + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{_text_value(v)}</arg_value>\n" for k, v in c.arguments.items())
            + "</tool_call>" for c in calls)
    if tool_parser == "gpt-oss":
        return "".join(f"<|start|>assistant<|channel|>commentary to=functions.{c.name} <|constrain|>json<|message|>"
                       f"{_j(c.arguments)}<|call|>" for c in calls)
    if tool_parser == "pythonic":
        return "[" + ", ".join(f"{c.name}(" + ", ".join(f"{k}={v!r}" for k, v in c.arguments.items()) + ")"
                               for c in calls) + "]"
    raise KeyError(tool_parser)


def render(tool_parser: str, reasoning_parser: str | None, content: str, reasoning: str | None,
           calls: list[Call]) -> str:
    """A whole reply: reasoning (in the reasoning parser's tags), then content, then the calls."""
    if tool_parser == "gpt-oss":
        text = f"<|channel|>analysis<|message|>{reasoning or 'thinking'}<|end|>"
        if content:
            text += f"<|start|>assistant<|channel|>final<|message|>{content}<|return|>"
        return text + (render_calls(tool_parser, calls) if calls else "")
    body = content
    if calls:
        body = (content + "\n" if content else "") + render_calls(tool_parser, calls)
    if reasoning is None:
        return body
    if reasoning_parser == "qwen3":
        return f"<think>\n{reasoning}\n</think>\n\n{body}"
    if reasoning_parser == "deepseek-r1":
        return f"{reasoning}\n</think>\n\n{body}"
    if reasoning_parser == "kimi":
        return f"◁think▷{reasoning}◁/think▷{body}"
    raise KeyError(reasoning_parser)


PAIRS = [
    ("qwen25", None), ("qwen25", "qwen3"), ("hermes", None), ("qwen3_coder", None), ("qwen3_coder", "qwen3"),
    ("llama3", None), ("mistral", None), ("deepseekv3", None), ("deepseekv3", "deepseek-r1"),
    ("deepseekv31", None), ("deepseekv31", "deepseek-r1"), ("kimi_k2", None), ("kimi_k2", "kimi"),
    ("glm45", None), ("glm45", "qwen3"), ("gpt-oss", None), ("gpt-oss", "gpt-oss"), ("pythonic", None),
]
# replies that never have content beside their calls (the reference reads only a bare list)
_CALLS_ONLY = {"pythonic", "llama3"}


def corpus(seed: int = 0, well_formed: int = 150, malformed: int = 60, streamed: int = 15) -> list[Case]:
    rng = random.Random(seed)
    cases: list[Case] = []
    for tool_parser, reasoning_parser in PAIRS:
        prefix = f"{tool_parser}+{reasoning_parser or '-'}"

        def add(kind: str, text: str, content: str = "", reasoning: str | None = None, calls=(),
                pair=(prefix, tool_parser, reasoning_parser)):
            cases.append(Case(f"{pair[0]}/{kind}/{len(cases)}", pair[1], pair[2], kind, text,
                              content, reasoning, list(calls)))

        thinks = reasoning_parser is not None or tool_parser == "gpt-oss"
        for _ in range(well_formed):
            calls = [random_call(rng) for _ in range(rng.choice([0, 1, 1, 2, 3]))]
            content = rng.choice(SENTENCES) if not calls or (tool_parser not in _CALLS_ONLY and rng.random() < 0.5) else ""
            reasoning = rng.choice(THOUGHTS) if thinks and (reasoning_parser is not None) else None
            if tool_parser == "gpt-oss" and calls and content:
                content = ""  # a call ends gpt-oss's turn: no final answer beside it
            text = render(tool_parser, reasoning_parser, content, reasoning, calls)
            add("well_formed", text, content, reasoning, calls)
        if reasoning_parser in ("qwen3", "kimi"):  # the template opened the block: the reply only closes it
            start, end = ("<think>", "</think>") if reasoning_parser == "qwen3" else ("◁think▷", "◁/think▷")
            for _ in range(10):
                calls = [random_call(rng) for _ in range(rng.choice([0, 1]))]
                content, reasoning = rng.choice(SENTENCES), rng.choice(THOUGHTS)
                text = render(tool_parser, reasoning_parser, content, reasoning, calls)
                add("opened_in_prompt", text.replace(start, "", 1), content, reasoning, calls)
        if reasoning_parser is not None and tool_parser != "gpt-oss":
            for _ in range(20):
                hidden = render_calls(tool_parser, [random_call(rng)])
                content = rng.choice(SENTENCES)
                add("in_reasoning", render(tool_parser, reasoning_parser, content, "I could call " + hidden, []),
                    content, "I could call " + hidden, [])
        for i in range(malformed):
            calls = [random_call(rng) for _ in range(rng.randint(1, 2))]
            text = render(tool_parser, reasoning_parser, "", rng.choice(THOUGHTS) if reasoning_parser else None, calls)
            if i % 3 == 0:
                start = text.find(render_calls(tool_parser, calls)[:6])
                add("truncated", text[: rng.randint(start + 1, len(text) - 1)])
            elif i % 3 == 1:
                add("malformed", _break(tool_parser, text, rng))
            else:
                calls[0].name = "no_such_tool"
                add("malformed", render(tool_parser, reasoning_parser, "", None, calls))
        for _ in range(10 if tool_parser != "gpt-oss" else 0):  # gpt-oss's turn ends at <|call|>
            calls = [random_call(rng)]
            thought = rng.choice(THOUGHTS) if reasoning_parser else None
            add("trailing", render(tool_parser, reasoning_parser, "", thought, calls) + "\nDone, see above.",
                "Done, see above.", thought, calls)
        for case in [c for c in cases if c.id.startswith(prefix + "/well_formed/")][:streamed]:
            cases.append(replace(case, id=case.id.replace("/well_formed/", "/streamed/"), kind="streamed",
                                 stream=True))
    return cases


def _break(tool_parser: str, text: str, rng: random.Random) -> str:
    """Damage one call: drop a brace of its JSON or a closing tag."""
    for target in ("}", "</function>", "</arg_value>", ")"):
        pos = text.rfind(target)
        if pos != -1 and (target == "}" or tool_parser in ("qwen3_coder", "glm45", "pythonic")):
            return text[:pos] + text[pos + len(target):]
    return text[:-3]  # the closing tag cut

"""gpt-oss's harmony format (``gpt-oss``, as tool parser and as reasoning parser).

What it is: the parsers SGLang and vLLM name ``gpt-oss`` (vLLM's tool parser: ``openai``).
A reply is a run of messages, each ``<|start|>assistant<|channel|>CHANNEL ...<|message|>BODY``
closed by ``<|end|>``, ``<|call|>`` or ``<|return|>`` (the first message's
``<|start|>assistant`` is in the prompt; a stop token the server cut off ends at the end of
the text). The ``analysis`` channel is reasoning; ``final`` is the answer; a message addressed
``to=functions.NAME`` on the ``commentary`` channel is a call whose body is its JSON
arguments; commentary without a recipient (a preamble) is content.
What it is not: a runner of the built-in ``browser``/``python`` tools, nor a reader of token
ids (this reads text; ``openai_harmony`` is not needed). A ``to=functions.NAME`` message on
the ``analysis`` channel is reasoning, so it is not run (an error says so).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agentrl.toolcalls.output import CallsFound, Tools, call_from_json, load_json

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
MARKERS = ("to=functions.",)
EXAMPLE = '<|start|>assistant<|channel|>commentary to=functions.tool_name <|constrain|>json<|message|>{"arg": "value"}<|call|>'
_MESSAGE = re.compile(
    r"(?:<\|start\|>[^<]*)?<\|channel\|>(.*?)<\|message\|>(.*?)(<\|end\|>|<\|call\|>|<\|return\|>|(?=<\|start\|>)|$)",
    re.DOTALL,
)
_RECIPIENT = re.compile(r"to=([\w.\-]+)")


@dataclass
class Message:
    channel: str
    recipient: str | None
    body: str
    raw: str


def messages(text: str) -> tuple[str, list[Message]]:
    """The text outside every message (before, between, after), and each message in order."""
    found, outside, pos = [], [], 0
    for match in _MESSAGE.finditer(text):
        outside.append(text[pos : match.start()])
        pos = match.end()
        header = match.group(1)
        channel = header.split()[0] if header.split() else ""
        start_tag = match.group(0)[: match.group(0).find(CHANNEL)]
        recipient = _RECIPIENT.search(header) or _RECIPIENT.search(start_tag)
        found.append(Message(channel, recipient.group(1) if recipient else None, match.group(2), match.group(0)))
    outside.append(text[pos:])
    return "".join(outside), found


def split_reasoning(text: str) -> tuple[str | None, str]:
    """The analysis channel's text as reasoning; the other messages, as text, for the tool parser
    (an analysis message addressed to a tool goes there too, to be reported as not run)."""
    lead, found = messages(text)
    thinking = [m.channel == "analysis" and m.recipient is None for m in found]
    thoughts = [m.body.strip() for m, t in zip(found, thinking, strict=True) if t]
    rest = lead + "".join(m.raw for m, t in zip(found, thinking, strict=True) if not t)
    return ("\n".join(thoughts) if thoughts else None), rest


def parse_calls(text: str, tools: Tools = None) -> CallsFound:
    lead, found = messages(text)
    content, calls, errors = [lead.strip()], [], []
    for message in found:
        if message.recipient is None:
            if message.channel != "analysis":
                content.append(message.body.strip())
            continue
        if message.channel == "analysis":
            errors.append(f"a call to {message.recipient!r} on the analysis channel is reasoning and was not run")
            continue
        if not message.recipient.startswith("functions."):
            errors.append(f"recipient {message.recipient!r} is not a function; write {EXAMPLE}")
            continue
        name = message.recipient[len("functions.") :]
        args, error = load_json(message.body.strip(), f"the arguments of {name!r}", EXAMPLE)
        call, error = (None, error) if error else call_from_json(name, args, tools, EXAMPLE)
        if call is None:
            errors.append(error)
            content.append(message.raw)
        else:
            calls.append(call)
    return CallsFound("\n".join(part for part in content if part), calls, errors)

"""check_token_drift: does re-tokenizing a conversation give back the tokens it was built from?

What it is: a diagnostic for any Hugging Face tokenizer and chat template. Multi-turn
trainers that re-render and re-tokenize the whole conversation train on tokens the model may
never have produced: BPE merges across the boundary between sampled text and the template's
text, or a template that renders history differently (Qwen3's drops earlier ``<think>``
blocks). ``check_token_drift(tokenizer, messages)`` builds the conversation the way the
``ChatClient`` does — turn by turn, each assistant turn's tokens kept as sampled, only new
messages tokenized — and compares it with the full re-rendering, reporting the first token
where the two differ and the assistant turns at which the ChatClient starts a new segment.

Each assistant message stands for what the model sampled: by default the tokens of its
text as the template renders it in place (up to and including the EOS token), or the ids
passed in ``completions`` (one list per assistant message), e.g. those a run recorded.

What it is not: a fix. Where it reports drift, train on the ChatClient's exported token
streams (they are exact by construction); where it reports breaks, expect one trajectory per
segment.

Main hook::

    report = check_token_drift(tokenizer, messages, tools)
    report.equal, report.first_difference, report.breaks
    print(report)     # where and how the two token streams part
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.api import Completion, Message
from agentrl.errors import RolloutError
from agentrl.rollout.conversation import TokenConversation
from agentrl.rollout.renderer import ChatRenderer


@dataclass
class DriftReport:
    """Incremental token stream vs full re-rendering of one conversation.

    ``incremental_ids``: the first segment's stream — the prompt, each assistant turn as
    sampled, the new messages' tokens, ending with the generation prompt of a next call (or
    where the first break cut it). ``full_ids``: the whole conversation rendered (with the
    generation prompt) and tokenized at once. ``first_difference``: the first index where
    they differ (the shorter length when one is a prefix of the other), None when equal.
    ``breaks``: indices into ``messages`` of the assistant turns whose call started a new
    segment (the rendering did not extend what was recorded; ``len(messages)`` when the final
    generation prompt did not); ``segments``: their count + 1.
    """

    equal: bool
    first_difference: int | None
    incremental_ids: list[int]
    full_ids: list[int]
    breaks: list[int] = field(default_factory=list)
    segments: int = 1
    context: str = ""  # both streams decoded around the first difference

    def __str__(self) -> str:
        if self.equal:
            return f"no drift: {len(self.full_ids)} tokens, incremental == full, {self.segments} segment(s)"
        return (f"drift at token {self.first_difference} (incremental {len(self.incremental_ids)} tokens, full "
                f"{len(self.full_ids)}); segments: {self.segments}, breaks at messages {self.breaks}\n{self.context}")


def check_token_drift(tokenizer: str | Path | Any, messages: Sequence[Message],
                      tools: Sequence[Mapping[str, Any]] | None = None, *,
                      completions: Sequence[Sequence[int]] | None = None,
                      chat_template_kwargs: Mapping[str, Any] | None = None) -> DriftReport:
    """Compare the ChatClient's turn-by-turn token stream of ``messages`` with their full
    re-tokenization; see the module docstring."""
    renderer = tokenizer if isinstance(tokenizer, ChatRenderer) else ChatRenderer(
        tokenizer, chat_template_kwargs=chat_template_kwargs)
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if completions is not None and len(completions) != len(turns):
        raise RolloutError(f"completions holds {len(completions)} token lists for {len(turns)} assistant messages")
    conv = TokenConversation(renderer)
    breaks: list[int] = []
    for k, i in enumerate(turns):
        text = renderer.render(messages[:i], tools)
        prompt = conv.prompt(text)
        if conv.calls and not prompt.extends:
            breaks.append(i)
        ids = list(completions[k]) if completions is not None else _as_sampled(renderer, messages, i, tools, text)
        conv.record(prompt, Completion(ids, [0.0] * len(ids), [0] * len(ids), "stop"))
    final_text = renderer.render(messages, tools)
    full = renderer.encode(final_text)
    last = conv.prompt(final_text)
    if conv.calls and not last.extends:
        breaks.append(len(messages))
    incremental = list(conv.segments[0].ids) if breaks else last.ids
    first = _first_difference(incremental, full)
    return DriftReport(equal=first is None and not breaks, first_difference=first, incremental_ids=incremental,
                       full_ids=full, breaks=breaks, segments=len(breaks) + 1,
                       context=_context(renderer, incremental, full, first))


def _as_sampled(renderer: ChatRenderer, messages: Sequence[Message], i: int, tools: Any, prompt_text: str) -> list[int]:
    """The tokens of assistant message ``i`` as the template renders it in place, through EOS."""
    whole = renderer.render(messages[: i + 1], tools, add_generation_prompt=False)
    if whole.startswith(prompt_text):
        turn = whole[len(prompt_text):]
        eos = renderer.tokenizer.eos_token
        if eos and eos in turn:
            turn = turn[: turn.rindex(eos) + len(eos)]
        return renderer.encode(turn)
    content = messages[i].get("content") or ""
    ids = renderer.encode(content if isinstance(content, str) else str(content))
    return ids + ([renderer.eos_token_id] if renderer.eos_token_id is not None else [])


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for j, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return j
    return None if len(a) == len(b) else min(len(a), len(b))


def _context(renderer: ChatRenderer, a: list[int], b: list[int], at: int | None, width: int = 8) -> str:
    if at is None:
        return ""
    lo = max(0, at - width)

    def show(ids: list[int]) -> str:
        return " ".join(repr(renderer.decode([t])) for t in ids[lo: at + width])

    return f"  incremental[{lo}:]: {show(a)}\n  full[{lo}:]:        {show(b)}"

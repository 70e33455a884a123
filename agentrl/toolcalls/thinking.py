"""Reasoning between think tags (``deepseek-r1``, ``qwen3``, ``kimi``): reasoning split from content.

What it is: the reasoning parsers SGLang and vLLM name ``deepseek-r1``, ``qwen3`` and ``kimi``.
Each returns (reasoning or None, the rest); the rest goes on to the tool parser, so a call
written inside reasoning is never run.
- ``deepseek-r1``: R1's template opens ``<think>`` in the prompt, so everything up to
  ``</think>`` is reasoning (a leading ``<think>`` is dropped); without ``</think>`` the whole
  reply is reasoning that was cut off.
- ``qwen3`` (``<think>``/``</think>``) and ``kimi`` (``◁think▷``/``◁/think▷``): reasoning
  when the reply opens with the start tag or holds the end tag (Qwen3-2507 thinking models'
  templates put the start tag in the prompt); else the whole reply is content. An unclosed
  block is reasoning to the end of the reply.
What it is not: SGLang's Qwen3.5 rule that a ``<tool_call>`` in an unclosed ``<think>`` ends
the reasoning: here that call stays reasoning (not run), and the caller reports it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ThinkTags:
    start: str
    end: str
    forced: bool  # the template opened the block in the prompt: no start tag is needed

    def split(self, text: str) -> tuple[str | None, str]:
        body = text.lstrip()
        opened = body.startswith(self.start)
        if opened:
            body = body[len(self.start) :]
        if self.end in body:
            reasoning, _, rest = body.partition(self.end)
            return reasoning.strip(), rest
        if opened or self.forced:
            return body.strip(), ""
        return None, text


DEEPSEEK_R1 = ThinkTags("<think>", "</think>", forced=True)
QWEN3 = ThinkTags("<think>", "</think>", forced=False)
KIMI = ThinkTags("◁think▷", "◁/think▷", forced=False)

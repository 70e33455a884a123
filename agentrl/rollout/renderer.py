"""ChatRenderer: a tokenizer's chat template and its token ids, as the rollout side uses them.

What it is: one object per tokenizer that renders chat messages to text with the tokenizer's
own template (tools included), turns text into token ids and ids back into text — exactly
(no clean-up of spaces, special tokens kept unless asked), through the fast tokenizer's Rust
backend when there is one. ``load_tokenizer`` takes a model directory or a tokenizer object
and loads a directory once per process. What it is not: the bookkeeping of a conversation's
tokens across turns (``agentrl.rollout.conversation``).

Rendering is Python (Jinja) and grows with the conversation; ``arender`` and ``aencode`` run
it (and tokenization) in a worker thread once the text passes ``offload_chars`` characters,
so long conversations never hold the event loop while short ones skip the thread hop.
Short conversations are rendered once per distinct value (an LRU of ``CACHE_SIZE``): the
episodes of a GRPO group share their prompt. A template that reads the clock (a date in its
system prompt) keeps the first rendering's date for such a conversation.
``min_tokens(text)`` is a lower bound on a text's token count from its UTF-8 size alone, so a
budget can refuse a huge text before any of it is tokenized.

Main hook::

    renderer = ChatRenderer("examples/tiny-model")
    text = renderer.render(messages, tools)          # ends with the generation prompt
    ids = renderer.encode(text)
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.api import Message
from agentrl.errors import ModelError

_load_lock = threading.Lock()
CACHE_SIZE = 1024


@functools.lru_cache(maxsize=8)
def _load_dir(path: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load a tokenizer from {path!r} ({e}); pass a Hugging Face model "
                         "directory with tokenizer files, or a tokenizer object") from e


def load_tokenizer(tokenizer: str | Path | Any) -> Any:
    """A tokenizer object from a model directory (loaded once per process) or the object itself."""
    if isinstance(tokenizer, (str, Path)):
        with _load_lock:
            return _load_dir(str(Path(tokenizer).expanduser().resolve()))
    if not hasattr(tokenizer, "apply_chat_template"):
        raise ModelError(f"expected a model directory or a Hugging Face tokenizer, got {type(tokenizer).__name__}")
    return tokenizer


def token_decoder(model: str | Path) -> Any:
    """``decode(ids) -> text`` with the model's tokenizer, special tokens kept (for samples)."""
    tokenizer = load_tokenizer(model)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False)


class ChatRenderer:
    """Messages -> text -> token ids and back, for one tokenizer and chat template."""

    def __init__(self, tokenizer: str | Path | Any, *, chat_template_kwargs: Mapping[str, Any] | None = None,
                 offload_chars: int = 32_768, cache_chars: int = 4096) -> None:
        self.tokenizer = load_tokenizer(tokenizer)
        if not getattr(self.tokenizer, "chat_template", None):
            raise ModelError(f"the tokenizer {getattr(self.tokenizer, 'name_or_path', '')!r} has no chat template; "
                             "the rollout side renders conversations with it")
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.offload_chars = offload_chars
        self._backend = getattr(self.tokenizer, "backend_tokenizer", None)
        self.eos_token_id = self.tokenizer.eos_token_id
        self._bytes_per_token: int | None = None
        self.cache_chars = cache_chars
        self._render_cached = functools.lru_cache(maxsize=CACHE_SIZE)(lambda key: self._render(*json.loads(key)))

    # ------------------------------------------------------------------ text

    def render(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None, *,
               add_generation_prompt: bool = True) -> str:
        """The template's text for ``messages`` (and ``tools``), ending with the generation
        prompt unless ``add_generation_prompt`` is False. Short conversations (under
        ``cache_chars``) are remembered by value (the last ``CACHE_SIZE``): a GRPO group's episodes
        all start from one prompt, rendered once."""
        if _size(messages) < self.cache_chars:
            try:
                key = json.dumps([messages, tools, add_generation_prompt], ensure_ascii=False)
            except (TypeError, ValueError):  # objects that are not plain JSON: rendered as they are
                key = None
            if key is not None:
                return self._render_cached(key)
        return self._render(messages, tools, add_generation_prompt)

    def _render(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None,
                add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), tools=list(tools) if tools else None, add_generation_prompt=add_generation_prompt,
            tokenize=False, **self.chat_template_kwargs)

    async def arender(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None, *,
                      add_generation_prompt: bool = True) -> str:
        """``render``, in a worker thread when the conversation is long (see the module docstring)."""
        if _size(messages) < self.offload_chars:
            return self.render(messages, tools, add_generation_prompt=add_generation_prompt)
        return await asyncio.to_thread(self.render, messages, tools, add_generation_prompt=add_generation_prompt)

    # ------------------------------------------------------------------ tokens

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as is: no special tokens added (the template writes its own)."""
        if not text:
            return []
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    async def aencode(self, text: str) -> list[int]:
        """``encode``, in a worker thread when ``text`` passes ``offload_chars`` characters."""
        if len(text) < self.offload_chars:
            return self.encode(text)
        return await asyncio.to_thread(self.encode, text)

    @property
    def bytes_per_token(self) -> int:
        """Twice the most UTF-8 bytes one token of the vocabulary stands for (twice: normalizers
        may shrink a text): no text of n tokens is longer than n times this."""
        if self._bytes_per_token is None:
            longest = max((len(str(t).encode()) for t in self.tokenizer.get_vocab()), default=1)
            self._bytes_per_token = 2 * max(longest, 4)
        return self._bytes_per_token

    def min_tokens(self, text: str) -> int:
        """At least this many tokens make up ``text``: its UTF-8 bytes over ``bytes_per_token``."""
        return len(text.encode("utf-8", "surrogatepass")) // self.bytes_per_token

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` with no clean-up, so that text and ids stand for the same thing."""
        if self._backend is not None:
            return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens,
                                     clean_up_tokenization_spaces=False)


def _size(messages: Sequence[Message]) -> int:
    n = 0
    for m in messages:
        content = m.get("content")
        n += len(content) if isinstance(content, str) else len(str(content or ""))
        for call in m.get("tool_calls") or ():
            n += len(str(call))
    return n

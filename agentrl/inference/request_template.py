"""A chat template a request brings (``chat_template_kwargs.chat_template``, or vLLM's top-level
``chat_template``): refused unless the server trusts them, and rendered within bounds when it does.

What it is: ``requested_template(body, kwargs, trusted)`` — the template a chat request names,
refused with a 400 unless ``agentrl serve`` was started with ``--trust-request-chat-template``
(vLLM's flag and rule); and ``render_bounded(render)`` — a trusted one rendered in a forked
child process (it shares the tokenizer without pickling) that is killed past ``RENDER_TIMEOUT_S``,
may allocate at most ``RENDER_MEMORY_BYTES`` more than the server held, and returns at most
``MAX_RENDERED_CHARS`` characters. Jinja's sandbox stops attribute tricks, not a template that
loops for hours or builds a 100 MB string; the child bounds both, and the event loop only
waits on a pipe.

What it is not: a bound on the server's own template (the tokenizer's, chosen by the operator,
rendered in ``openai_routes``), nor on the template variables of ``chat_template_kwargs``.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import resource
from collections.abc import Callable
from typing import Any

from agentrl.errors import Refused

RENDER_TIMEOUT_S = 5.0
"""Seconds a request's template may render before its process is killed and the request refused."""
RENDER_MEMORY_BYTES = 1 << 30
"""Bytes of address space a request's template may add to the server's while it renders."""
MAX_TEMPLATE_CHARS = 100_000
"""The longest template a request may bring."""
MAX_RENDERED_CHARS = 8 << 20
"""The longest prompt text a request's template may produce."""


def requested_template(body: dict[str, Any], kwargs: dict[str, Any], trusted: bool) -> str | None:
    """The template the request brings (None: the tokenizer's own), or a ``Refused`` that says
    how to allow one. ``kwargs`` is the request's ``chat_template_kwargs``."""
    template = kwargs.get("chat_template", body.get("chat_template"))
    if template is None:
        return None
    if not trusted:
        raise Refused("a chat template sent in the request is refused: this server renders its model's own; "
                      "start agentrl serve with --trust-request-chat-template to accept them")
    if not isinstance(template, str) or not template or len(template) > MAX_TEMPLATE_CHARS:
        raise Refused(f"chat_template must be a Jinja template of 1 to {MAX_TEMPLATE_CHARS:,} characters")
    return template


def _child(render: Callable[[], str], conn: Any, memory_bytes: int) -> None:
    try:
        with open("/proc/self/statm") as f:
            held = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (held + memory_bytes, held + memory_bytes))
    except (OSError, ValueError):  # no /proc (not Linux): the time bound still holds
        pass
    try:
        text = render()
        if not isinstance(text, str):
            raise TypeError(f"the template rendered a {type(text).__name__}, not text")
        if len(text) > MAX_RENDERED_CHARS:
            raise ValueError(f"the template rendered {len(text):,} characters, more than {MAX_RENDERED_CHARS:,}")
        conn.send(("ok", text))
    except MemoryError:
        conn.send(("error", f"the template needed more than {memory_bytes >> 20} MiB"))
    except BaseException as e:  # noqa: BLE001 - whatever the template raised is the request's fault
        conn.send(("error", f"{type(e).__name__}: {str(e)[:200]}"))


async def render_bounded(render: Callable[[], str], *, timeout_s: float = RENDER_TIMEOUT_S,
                         memory_bytes: int = RENDER_MEMORY_BYTES) -> str:
    """``render()`` in a forked child within ``timeout_s`` and ``memory_bytes``; a template that
    raises, runs over or grows past them is a ``Refused`` (400) naming the bound."""
    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(render, theirs, memory_bytes), daemon=True)
    proc.start()
    theirs.close()
    try:
        if not await asyncio.to_thread(ours.poll, timeout_s):
            raise Refused(f"the request's chat template did not render within {timeout_s:g} s; it was stopped")
        try:
            kind, value = await asyncio.to_thread(ours.recv)
        except EOFError:  # the child died without an answer (killed for memory)
            raise Refused("the request's chat template stopped its renderer") from None
    finally:
        if proc.is_alive():
            proc.kill()
        await asyncio.to_thread(proc.join, 5.0)
        ours.close()
    if kind != "ok":
        raise Refused(f"the chat template could not render these messages: {value}")
    return value

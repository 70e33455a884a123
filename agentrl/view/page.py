"""The viewer's page: ``static/page.html`` with its styles, its script and (exported) its data inline.

What it is: ``render_page(data, title=...)`` — one HTML document with no external asset (a
Content-Security-Policy in it forbids loading any). Served, ``data`` is None and the script
asks the viewer's JSON routes; exported, ``data`` is embedded as JSON in
``<script type="application/json" id="agentrl-data">`` and the script reads it instead.
What it is not: the choice of what to embed (``agentrl.view.export``) or the routes
(``agentrl.view.viewer``).
"""

from __future__ import annotations

import html
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

PLACEHOLDER = re.compile("__(?:TITLE|STYLE|SCRIPT|DATA)__")
STATIC = Path(__file__).resolve().parent / "static"


@cache
def _asset(name: str) -> str:
    return (STATIC / name).read_text(encoding="utf-8")


def embed_json(data: Any) -> str:
    """``data`` as JSON that can sit inside a ``<script>`` element: no ``</script>``, no ``<!--``
    (every ``<``, ``>`` and ``&`` is escaped as ``\\u00XX``), no NaN."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026") \
        .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def render_page(data: Any | None, *, title: str) -> str:
    parts = {"__TITLE__": html.escape(title), "__STYLE__": _asset("viewer.css"), "__SCRIPT__": _asset("viewer.js"),
             "__DATA__": embed_json(data) if data is not None else "null"}
    # one pass, so that nothing inserted is searched for another placeholder
    return PLACEHOLDER.sub(lambda m: parts[m.group(0)], _asset("page.html"))

"""Prints the conformance figures of issue 28: per parser pair, how often SGLang's and vLLM's
parsers of the same name read a reply exactly as ours does, by kind of reply.

Run from the repository root: ``.venv/bin/python -m tests.toolcalls.conformance_report``
(needs ``make vllm`` and ``make sglang-frontend``; about 30 s on 2 cores). "n/a": the engine
has no text parser of that name. Figures are agreeing/compared; the pinned differences and
why we chose as we did are in ``test_conformance.py``.
"""

from __future__ import annotations

import sys

from .corpus import PAIRS, corpus
from .references import ENGINES, missing, pair_name, run_references, tally

KINDS = [("well_formed", "well-formed"), ("in_reasoning", "call in reasoning"), ("opened_in_prompt", "think opened by template"),
         ("streamed", "streamed"),
         ("malformed", "malformed (calls)"), ("truncated", "truncated (calls)"), ("trailing", "text after calls")]


def main() -> None:
    why = missing()
    if why:
        sys.exit(why)
    cases = corpus()
    t = tally(cases, run_references([c.to_request() for c in cases]))
    header = ["pair (tool+reasoning)", "cases", "ours = truth"] + [
        f"{engine} {label}" for _, label in KINDS for engine in ENGINES]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for tool_parser, reasoning_parser in PAIRS:
        pair = f"{tool_parser}+{reasoning_parser or '-'}"
        mine = [c for c in cases if pair_name(c) == pair]
        checked = [c for c in mine if c.kind in ("well_formed", "in_reasoning", "opened_in_prompt", "trailing", "streamed")]
        exact = sum(t["ours"][c.id] == t["truth"][c.id] for c in checked)
        row = [pair, str(len(mine)), f"{exact}/{len(checked)}"]
        for kind, _ in KINDS:
            for engine in ENGINES:
                n = t["compared"].get((engine, pair, kind), 0)
                if not any(c.kind == kind for c in mine):
                    row.append("—")
                elif n == 0:
                    row.append("n/a")
                else:
                    row.append(f"{n - len(t['disagree'].get((engine, pair, kind), []))}/{n}")
        print("| " + " | ".join(row) + " |")
    print(f"\n{len(cases)} replies; seed 0. Agreement: content and reasoning equal after stripping the "
          "whitespace at their edges, every call's name and decoded arguments equal, in order.")


if __name__ == "__main__":
    main()

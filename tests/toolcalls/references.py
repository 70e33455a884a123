"""Ours and the two references over the corpus, and how each result compares with the truth.

``run_references(cases)`` runs ``reference_runner.py`` twice in parallel, one process per
engine for the whole corpus: SGLang's parsers with vLLM's interpreter (it carries what they
import: triton, xgrammar, partial_json_parser, openai) and the sglang wheel of
``make sglang-frontend`` on PYTHONPATH; vLLM's in ``.venv-vllm`` (``make vllm``).
``normal(result)`` is what "agree exactly" compares: content and reasoning with the
whitespace at their edges dropped (the references differ among themselves there), reasoning
"" the same as None, and each call's name and decoded arguments in order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("reference_runner.py")
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
SGLANG_FRONTEND = Path(sys.executable).parent.parent / "sglang-frontend"
ENGINES = ("sglang", "vllm")


def missing() -> str | None:
    """Why the references cannot run here, or None."""
    if not VLLM_PYTHON.is_file():
        return f"{VLLM_PYTHON} is missing; run `make vllm`"
    if not (SGLANG_FRONTEND / "orjson").is_dir():
        return f"sglang's wheel is not in {SGLANG_FRONTEND} (with orjson); run `make sglang-frontend`"
    return None


def run_references(requests: list[dict]) -> dict[str, dict[str, dict]]:
    """{engine: {case id: result}} for both engines."""
    payload = json.dumps(requests, ensure_ascii=False)
    procs = {}
    for engine in ENGINES:
        env = {**os.environ, "PYTHONPATH": str(SGLANG_FRONTEND)} if engine == "sglang" else dict(os.environ)
        env.pop("PYTHONPATH", None) if engine == "vllm" else None
        procs[engine] = subprocess.Popen([str(VLLM_PYTHON), str(RUNNER), engine], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out = {}
    for engine, proc in procs.items():
        stdout, stderr = proc.communicate(payload, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"the {engine} reference runner failed:\n{stderr[-3000:]}")
        out[engine] = {r["id"]: r for r in json.loads(stdout)}
    return out


def normal(content: str | None, reasoning: str | None, calls: list[tuple[str, Any]]) -> tuple:
    return ((content or "").strip(), (reasoning or "").strip(), [(name, args) for name, args in calls])


def normal_reference(result: dict) -> tuple | None:
    if result["status"] != "ok":
        return None
    return normal(result["content"], result["reasoning"], [(c["name"], c["arguments"]) for c in result["calls"]])


def normal_ours(parsed) -> tuple:
    return normal(parsed.content, parsed.reasoning, [(c.name, c.arguments) for c in parsed.tool_calls])


def read_stream(case):
    """Ours fed the pieces the reference streaming parsers get; the ``ParsedOutput`` with the
    reasoning and content the deltas added up to."""
    from agentrl.toolcalls import StreamParser

    from .corpus import TOOLS
    from .reference_runner import stream_pieces

    parser = StreamParser(case.tool_parser, case.reasoning_parser, TOOLS)
    reasoning = content = ""
    for piece in stream_pieces(case.text):
        delta = parser.feed(piece)
        reasoning, content = reasoning + delta.reasoning, content + delta.content
    delta, out = parser.close()
    out.reasoning, out.content = (reasoning + delta.reasoning) or None, content + delta.content
    return out


def normal_truth(case) -> tuple:
    return normal(case.content, case.reasoning, [(c.name, c.arguments) for c in case.calls])


# the kinds compared on the calls alone: which calls would run
CALLS_ONLY_KINDS = ("malformed", "truncated")


def pair_name(case) -> str:
    return f"{case.tool_parser}+{case.reasoning_parser or '-'}"


def tally(cases, refs: dict[str, dict[str, dict]]) -> dict:
    """Ours and each reference on every case.

    Returns {"ours": {case id: normal}, "truth": {...}, engine: {case id: normal or None}} and,
    under "disagree", {(engine, pair, kind): [case ids where the engine differs from ours]};
    an engine without a parser of that name ("none") counts in neither. Malformed and truncated
    replies are compared on their calls alone.
    """
    from agentrl.toolcalls import parse

    from .corpus import TOOLS

    out: dict = {"ours": {}, "truth": {}, "disagree": {}, "compared": {}}
    for case in cases:
        out["ours"][case.id] = normal_ours(read_stream(case) if case.stream else
                                           parse(case.text, case.tool_parser, case.reasoning_parser, TOOLS))
        out["truth"][case.id] = normal_truth(case)
        for engine in ENGINES:
            result = refs[engine][case.id]
            if result["status"] == "none":
                continue
            key = (engine, pair_name(case), case.kind)
            out["compared"][key] = out["compared"].get(key, 0) + 1
            theirs, ours = normal_reference(result), out["ours"][case.id]
            if case.kind in CALLS_ONLY_KINDS:  # we keep a broken block in the content, for the model to see
                theirs, ours = theirs and theirs[2], ours[2]
            if theirs != ours:
                out["disagree"].setdefault(key, []).append(case.id)
    return out

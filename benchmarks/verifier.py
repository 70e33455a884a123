"""Benchmark of the verifiers: math verification throughput and agreement, HumanEval grading.

Measures, in one run:
  * ``math_verifs_per_s``: GSM8K gold answers written in varied forms (boxed, a final-answer
    line, ``18.0``, ``\\frac{36}{2}``, ``$18``, thousands separators, ``17 + 1``; wrong ones:
    off by one, ``\\sqrt{325}``, a hedge across two boxes), verified through
    ``VerifierPool.averify`` with ``--workers`` processes; the
    baseline is the same responses checked serially in this process with plain math-verify
    (``verify(parse(gold), parse(response))``, no pool), and ``ratio`` is pool / baseline.
    Number literals are decided in-process without a worker (``compare_numbers``), so
    ``math_verifs_per_s_symbolic_only`` also reports the items that need math-verify;
  * ``gold_agreement``: every GSM8K, AIME 2024 and AMC 2023 gold answer fed back as a
    response (``\\boxed{gold}``) must score 1.0 (target: 1.0);
  * ``humaneval_canonical_pass``: the share of the 164 canonical solutions that score 1.0
    through ``agentrl/Code-v0`` (target 1.0), and ``humaneval_broken_pass``: the share that
    still score above 0 once every ``return`` of the entry point returns None (target 0.0).

Prints progress lines, then one JSON object as the last line.
Usage: ``python benchmarks/verifier.py [--workers 2] [--limit N] [--skip-code]``.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.env.datasets import data_path, load_rows  # noqa: E402
from envs.math.pool import VerifierConfig, VerifierPool  # noqa: E402
from envs.math.verifier import compare_numbers, extract_answers, normalize_gold  # noqa: E402


def varied_forms(gold: str) -> list[tuple[str, bool]]:
    """(response, expected verdict) pairs for one integer-valued GSM8K gold."""
    n = int(gold.replace(",", ""))
    return [
        (f"So the total is \\boxed{{{n}}}.", True),
        (f"Adding up.\nThe answer is {n}.", True),
        (f"\\boxed{{{n}.0}}", True),
        (f"\\boxed{{\\frac{{{2 * n}}}{{2}}}}", True),
        (f"Final answer: ${n:,}", True),
        (f"\\boxed{{{n + 1}}}", False),
        (f"The answer is {n - 1}.", False),
        (f"\\boxed{{\\frac{{{n}}}{{3}}}}" if n % 3 else f"\\boxed{{{n}.5}}", False),
        (f"\\boxed{{{n - 1} + 1}}", True),  # an expression: math-verify reads it, then compared by value
        (f"\\boxed{{\\sqrt{{{n * n + 1}}}}}", False),  # irrational, near the gold (n + 1/2n)
        (f"First \\boxed{{{n}}}, or maybe \\boxed{{{n + 1}}}", False),  # a hedge across boxes
    ]


async def pool_rate(pool: VerifierPool, items: list[tuple[str, str, bool]]) -> tuple[float, int]:
    start = time.perf_counter()
    verdicts = await asyncio.gather(*(pool.averify(r, g) for r, g, _ in items))
    elapsed = time.perf_counter() - start
    return len(items) / elapsed, sum(v != want for v, (_, _, want) in zip(verdicts, items, strict=True))


def serial_rate(items: list[tuple[str, str, bool]]) -> float:
    """Plain math-verify, serially in this process: parse both sides, verify (the baseline)."""
    from math_verify import parse, verify

    start = time.perf_counter()
    for response, gold, _ in items:
        verify(parse(f"${normalize_gold(gold)}$"), parse(response))
    return len(items) / (time.perf_counter() - start)


def is_symbolic(response: str, gold: str) -> bool:
    """Whether the pool must run math-verify (not the in-process comparison of number literals)."""
    return any(compare_numbers(a, normalize_gold(gold)) is None for a in extract_answers(response))


def break_returns(source: str, entry_point: str) -> str:
    """The program with every ``return`` inside ``entry_point`` returning None."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == entry_point:
            for inner in ast.walk(node):
                if isinstance(inner, ast.Return):
                    inner.value = None
    return ast.unparse(tree)


async def humaneval(rows: list[dict], broken: bool, parallel: int = 4) -> list[float]:
    from envs.code.env import CodeEnv

    gate = asyncio.Semaphore(parallel)

    async def one(row: dict) -> float:
        code = row["prompt"] + row["canonical_solution"]
        if broken:
            code = break_returns(code, row["entry_point"])
        env = CodeEnv()
        async with gate:
            await env.areset(options={"task": row})
            _, reward, *_ = await env.astep(f"```python\n{code}\n```")
        return reward

    return list(await asyncio.gather(*(one(r) for r in rows)))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="GSM8K rows used for throughput")
    parser.add_argument("--skip-code", action="store_true", help="skip HumanEval (needs the local sandbox)")
    args = parser.parse_args()

    gsm8k = load_rows(data_path("gsm8k_test.jsonl"))
    golds = [normalize_gold(r["answer"]) for r in gsm8k]
    items = [(resp, g, want) for g in golds[: args.limit] for resp, want in varied_forms(g)]
    others = load_rows(data_path("aime24_test.jsonl")) + load_rows(data_path("amc23_test.jsonl"))
    all_golds = golds + [normalize_gold(r["answer"]) for r in others]

    with VerifierPool(VerifierConfig(workers=args.workers)) as pool:
        # start every worker (and its math-verify import) before timing
        await asyncio.gather(*(pool.averify(f"\\boxed{{{i} + 0.5}}", f"{i}.5") for i in range(32 * args.workers)))
        pool.stats.update(verified=0)
        rate, wrong = await pool_rate(pool, items)
        print(f"pool ({args.workers} workers): {rate:.0f} verifications/s over {len(items)}; "
              f"{wrong} verdicts differ from the expected", flush=True)
        symbolic = [it for it in items if is_symbolic(it[0], it[1])]
        symbolic_rate, symbolic_wrong = await pool_rate(pool, symbolic)
        print(f"  of which through math-verify in the workers: {len(symbolic)}, alone "
              f"{symbolic_rate:.0f}/s ({symbolic_wrong} wrong)", flush=True)
        agreement = await asyncio.gather(*(pool.averify(f"\\boxed{{{g}}}", g) for g in all_golds))
        gold_agreement = sum(agreement) / len(agreement)
        print(f"gold agreement: {sum(agreement)}/{len(agreement)}", flush=True)
        stats = dict(pool.stats)
    baseline_items = items[: min(len(items), 800)]
    baseline = serial_rate(baseline_items)
    print(f"baseline (serial, in-process, no pool): {baseline:.0f} verifications/s over {len(baseline_items)}",
          flush=True)
    symbolic_baseline = serial_rate(symbolic[:400])
    print(f"  on the math-verify items alone: {symbolic_baseline:.0f}/s over {len(symbolic[:400])}", flush=True)

    result = {
        "math_verifs_per_s": round(rate, 1),
        "math_verifs_per_s_symbolic_only": round(symbolic_rate, 1),
        "symbolic_items": len(symbolic),
        "baseline_serial_verifs_per_s": round(baseline, 1),
        "ratio": round(rate / baseline, 3),
        "baseline_serial_symbolic_only": round(symbolic_baseline, 1),
        "ratio_symbolic_only": round(symbolic_rate / symbolic_baseline, 3),
        "math_wrong_verdicts": wrong + symbolic_wrong,
        "math_items": len(items),
        "gold_agreement": round(gold_agreement, 4),
        "gold_items": len(all_golds),
        "workers": args.workers,
        "cpus": os.cpu_count(),
        "pool_stats": stats,
    }
    if not args.skip_code:
        rows = load_rows(data_path("HumanEval.jsonl.gz"))
        start = time.perf_counter()
        canonical = await humaneval(rows, broken=False)
        broken = await humaneval(rows, broken=True)
        failed = [r["task_id"] for r, s in zip(rows, canonical, strict=True) if s != 1.0]
        still = [r["task_id"] for r, s in zip(rows, broken, strict=True) if s > 0]
        print(f"HumanEval canonical: {len(rows) - len(failed)}/{len(rows)} (failed: {failed}); "
              f"broken still passing: {still}; {time.perf_counter() - start:.0f} s", flush=True)
        result.update(humaneval_canonical_pass=round(1 - len(failed) / len(rows), 4),
                      humaneval_broken_pass=round(len(still) / len(rows), 4))
        from agentrl.plugins import SHARED_SANDBOXES

        for sandbox in SHARED_SANDBOXES.values():
            await sandbox.aclose()
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())

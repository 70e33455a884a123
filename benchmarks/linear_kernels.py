"""Which CPU kernel should multiply ``agentrl serve``'s projections: ``F.linear`` on the plain
float32 weights, or one of torch's own prepacked paths (no extra package)?

What is measured, for each model size of ``benchmarks/sizes.py`` (its hidden, heads and MLP
shapes), at each row count M (a decode step's rows) and for each of the four projections the
decoder runs per layer (fused q/k/v, o, fused gate/up, down): the time of one product by

  * ``plain``: ``F.linear(x, W)`` (what the decoder ran before ``agentrl.inference.prepacked``);
  * ``onednn_packed``: ``torch.ops.mkldnn._linear_pointwise`` on ``W`` reordered once by
    ``torch.ops.mkldnn._reorder_linear_weight`` (what the decoder runs now);
  * ``onednn_plain``: the same oneDNN kernel handed the plain ``W`` (no reorder kept);
  * ``mkl_packed``: ``torch.ops.mkl._mkl_linear`` on ``W`` packed by
    ``torch.ops.mkl._mkl_reorder_linear_weight`` for exactly M rows (inductor's CPU freezing path
    for float32).

Best of 7 rounds, the variants interleaved within each round (so a shared machine's load
changes hit all alike). Also the largest absolute difference from ``plain`` of each variant's
output. One JSON line per size: per M, the four projections' summed time of each variant and
``ratio_<variant>`` = plain's time / the variant's (above 1: faster than plain). Usage::

    .venv/bin/python benchmarks/linear_kernels.py [--sizes 25m,100m,0.5b] [--rows 1,4,16,64] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sizes import SHAPES  # noqa: E402 (the benchmark beside this one)


def best_times(fns: dict, reps: int, rounds: int = 7) -> dict[str, float]:
    for f in fns.values():
        f()
        f()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, f in fns.items():
            start = time.perf_counter()
            for _ in range(reps):
                f()
            best[name] = min(best[name], (time.perf_counter() - start) / reps)
    return best


def variants(x, w, packed, mkl_w) -> dict:
    """The four ways to compute ``F.linear(x, w)`` (``packed``: oneDNN's copy; ``mkl_w``: MKL's for x's rows)."""
    import torch
    import torch.nn.functional as F

    dnn, m = torch.ops.mkldnn, x.shape[0]
    return {"plain": lambda: F.linear(x, w),
            "onednn_packed": lambda: dnn._linear_pointwise(x, packed, None, "none", [], ""),
            "onednn_plain": lambda: dnn._linear_pointwise(x, w, None, "none", [], ""),
            "mkl_packed": lambda: torch.ops.mkl._mkl_linear(x, mkl_w, w, None, m)}


def one_size(size: str, rows: list[int]) -> dict:
    import torch

    hidden, _, heads, kv_heads, head_dim, mlp = SHAPES[size]
    shapes = {"qkv": ((heads + 2 * kv_heads) * head_dim, hidden), "o": (hidden, heads * head_dim),
              "gate_up": (2 * mlp, hidden), "down": (hidden, mlp)}
    dnn, mkl = torch.ops.mkldnn, torch.ops.mkl
    totals: dict[int, dict[str, float]] = {m: {} for m in rows}
    errors: dict[str, float] = {}
    for n, k in shapes.values():
        w = torch.randn(n, k) / k ** 0.5
        packed = dnn._reorder_linear_weight(w, 16)
        for m in rows:
            x = torch.randn(m, k)
            mkl_w = mkl._mkl_reorder_linear_weight(w, m)
            fns = variants(x, w, packed, mkl_w)
            ref = fns["plain"]()
            for name, f in fns.items():
                errors[name] = max(errors.get(name, 0.0), (f() - ref).abs().max().item())
            for name, t in best_times(fns, max(10, int(5e7 / (n * k * max(m, 4))))).items():
                totals[m][name] = totals[m].get(name, 0.0) + t
    return {"benchmark": "linear_kernels", "size": size, "threads": torch.get_num_threads(),
            "shapes_nk": shapes, "max_abs_diff": {k: float(f"{v:.2e}") for k, v in errors.items()},
            "rows": {str(m): {**{f"{k}_us": round(v * 1e6, 1) for k, v in t.items()},
                              **{f"ratio_{k}": round(t["plain"] / v, 2) for k, v in t.items() if k != "plain"}}
                     for m, t in totals.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="25m,100m,0.5b")
    ap.add_argument("--rows", default="1,4,16,64", help="row counts M, comma-separated")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if not torch.backends.mkldnn.is_available():
        sys.exit("benchmarks/linear_kernels.py: this torch has no oneDNN (torch.backends.mkldnn)")
    for size in args.sizes.split(","):
        print(json.dumps(one_size(size.strip(), [int(m) for m in args.rows.split(",")])), flush=True)


if __name__ == "__main__":
    main()

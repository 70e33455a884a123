"""The GPU paths, run once on a machine with a CUDA GPU: ``agentrl serve --device cuda``, the
trainer in bfloat16 over NCCL, and ``agentrl train`` end to end on the device.

What is checked, in order (each stage's result is one JSON line; a stage that fails says why
and the next ones still run):

  * ``serve``: ``agentrl serve --device cuda`` on the model: greedy tokens equal transformers'
    argmax on the same GPU (float32), the largest |logprob - transformers'| of T = 1 samples, the demo's
    rollout (16 prompts x n = 16 x 12 tokens at T = 1) in samples per second;
  * ``trainer``: ``benchmarks/trainer.py --device cuda`` (the actor on one NCCL rank, bf16
    compute, against a bare PyTorch step under autocast);
  * ``train``: ``agentrl train examples/arith_grpo.yaml device=cuda`` for ``--steps`` steps
    (server and trainer rank on the one GPU, weights through the disk): its summary line, the
    mean step time, and the mean |behaviour - trainer| log-probability on on-policy tokens
    (bf16 trainer against the float32 server) from the run's sampled trajectories.

The last line is one JSON object with every stage. Usage (from the repository root)::

    python benchmarks/gpu_check.py [--out DIR] [--steps 40] [--device cuda]

``--device cpu`` runs the same stages on a CPU (to try the script where there is no GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "examples" / "tiny-model"
PROMPTS = [[49, 50, 43, 55, 61], [52, 43, 56, 61], [57, 57, 45, 49, 52, 61]]


def stage_env(device: str) -> dict:
    import torch

    out = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        out.update(gpu=torch.cuda.get_device_name(0), bf16=torch.cuda.is_bf16_supported(),
                   nccl=torch.distributed.is_nccl_available())
    return out


def stage_serve(device: str, out_dir: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl.api import SamplingParams
    from agentrl.client import RemoteEngine
    from agentrl.process.services import ServerProcess

    hf = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).to(device).eval()

    async def run(url: str) -> tuple[list, list[float]]:
        async with RemoteEngine(url) as engine:
            greedy = await asyncio.gather(*(engine.generate(p, SamplingParams(max_new_tokens=24, temperature=0))
                                            for p in PROMPTS))
            sampled = await asyncio.gather(*(engine.generate(p, SamplingParams(max_new_tokens=24, seed=i))
                                             for i, p in enumerate(PROMPTS)))
            rates = []
            prompts = [PROMPTS[i % 3] + [50 + i] for i in range(16)]
            for _ in range(4):  # the first is a warm-up
                t0 = time.perf_counter()
                groups = await asyncio.gather(*(engine.generate_group(
                    p, SamplingParams(max_new_tokens=12, temperature=1.0), 16) for p in prompts))
                rates.append(sum(len(g) for g in groups) / (time.perf_counter() - t0))
            return greedy, sampled, rates[1:]

    with ServerProcess(MODEL, "--device", device, "--max-running-requests", "256", threads=4,
                       log_path=out_dir / "serve.log") as server:
        greedy, sampled, rates = asyncio.run(run(server.url))
    same, worst = True, 0.0
    for prompt, c, s in zip(PROMPTS, greedy, sampled, strict=True):
        with torch.no_grad():
            expect = hf.generate(torch.tensor([prompt], device=device), max_new_tokens=24,
                                 do_sample=False)[0, len(prompt):].tolist()
            logits = hf(torch.tensor([prompt + s.tokens], device=device)).logits[0, len(prompt) - 1:-1].float()
        # a T = 1 sample's logprobs are the model's own (greedy ones are of the point mass: 0)
        ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(s.tokens, device=device)[:, None])[:, 0]
        same &= c.tokens == expect[: len(c.tokens)]
        worst = max(worst, max(abs(a - b) for a, b in zip(s.logprobs, ref.tolist(), strict=True)))
    return {"greedy_tokens_equal": same, "logprob_max_abs_diff": worst,
            "demo_samples_per_s": round(statistics.median(rates), 1)}


def stage_trainer(device: str, out_dir: Path) -> dict:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "trainer.py"), "--device", device, "--threads", "4",
           "--repeats", "5"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    (out_dir / "trainer.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmarks/trainer.py exited {proc.returncode}: {proc.stderr[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def stage_train(device: str, out_dir: Path, steps: int, name: str = "train", extra: tuple[str, ...] = (),
                timeout_s: float = 480.0) -> dict:
    run_dir = out_dir / name
    shutil.rmtree(run_dir, ignore_errors=True)  # this script's own output of an earlier check
    cmd = [sys.executable, "-m", "agentrl.cli", "train", str(ROOT / "examples" / "arith_grpo.yaml"),
           f"device={device}", f"run_dir={run_dir}", f"steps={steps}", f"trainer.total_steps={steps}",
           "threads=4", "inference.threads=4", "eval.limit=500", "eval.every_steps=0",
           f"checkpoint.every_steps={steps}", "max_minutes=6", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    wall = time.perf_counter() - t0
    (out_dir / f"{name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"agentrl train exited {proc.returncode}: {(proc.stdout + proc.stderr)[-2500:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])  # the run's last line
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    step_s = [m["perf/step_s"] for m in metrics if "perf/step_s" in m]
    parts = {k: statistics.median(v) for k in ("train_s", "train_prepare_s", "train_sample_s", "train_update_s",
                                                 "weight_stage_s", "weight_pause_s", "trainer_wait_s")
             if (v := [m[f"perf/{k}"] for m in metrics if f"perf/{k}" in m])}
    gaps = []
    for path in sorted((run_dir / "trajectories").glob("step_*.jsonl")):
        step = int(path.stem.split("_")[1])
        for line in path.read_text().splitlines():
            row = json.loads(line)
            for lp, tlp, v in zip(row["logprobs"], row.get("trainer_logprobs", []), row["versions"], strict=False):
                if v == step - 1:  # sampled by the weights the trainer scored it with
                    gaps.append(abs(lp - tlp))
    return {"eval_before": summary.get("eval_before"), "eval_after": summary.get("eval_after"),
            "steps": summary.get("steps"), "wall_s": round(wall, 1),
            "step_s_median": round(statistics.median(step_s), 3) if step_s else None,
            **{f"{k}_median": round(v, 3) for k, v in parts.items()},
            "onpolicy_logprob_gap_mean": round(sum(gaps) / len(gaps), 6) if gaps else None,
            "onpolicy_tokens": len(gaps),
            "failed": sum(m.get("rollout/failed", 0) for m in metrics)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/gpu_check")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--stages", default="env,serve,trainer,train",
                    help="of env, serve, trainer, train, train_unshared (trainer.share_prefix=false), "
                         "train_distributed (weights over torch.distributed: NCCL on a GPU)")
    args = ap.parse_args()
    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    stages = {"env": lambda: stage_env(args.device), "serve": lambda: stage_serve(args.device, out_dir),
              "trainer": lambda: stage_trainer(args.device, out_dir),
              "train": lambda: stage_train(args.device, out_dir, args.steps),
              "train_unshared": lambda: stage_train(args.device, out_dir, args.steps, "train_unshared",
                                                    ("trainer.share_prefix=false",)),
              "train_distributed": lambda: stage_train(args.device, out_dir, min(args.steps, 5), "train_distributed",
                                                       ("trainer.weight_sync.transport=distributed",), 150.0)}
    for name in args.stages.split(","):
        t0 = time.perf_counter()
        try:
            results[name] = {"ok": True, **stages[name]()}
        except Exception as e:  # noqa: BLE001 — a failed stage is reported, and the next ones run
            results[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[-3000:],
                             "traceback": traceback.format_exc()[-3000:]}
        results[name]["seconds"] = round(time.perf_counter() - t0, 1)
        print(json.dumps({"stage": name, **results[name]}), flush=True)
    print(json.dumps({"benchmark": "gpu_check", "device": args.device, **results}))
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

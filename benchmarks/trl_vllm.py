"""The benchmark-side shims that let TRL 1.16's vLLM paths run on vLLM's CPU build (0.32), for
``benchmarks/vs_trl.py --trl-configs vllm-server,vllm-colocate``. Not part of agentrl: it runs in
``.venv-trl-vllm`` (``make trl-vllm``), inside vs_trl.py's TRL worker, and patches TRL's classes in
that process only. What each shim replaces, and why TRL as shipped does not run on a CPU:

1. **Weight sync through a file.** TRL pushes weights into vLLM with vLLM's NCCL weight-transfer
   engine (``VLLMClient.init_communicator`` refuses any device but CUDA); colocate mode calls
   ``model.load_weights`` per tensor, which meets vLLM's CPU GEMM layers (``'Parameter' object has
   no attribute 'weight_loader'``). Here ``VLLMGeneration.sync_weights`` writes the trainer's
   parameters (TRL's own ``_iter_named_params``) to ``model.safetensors`` in a copy of the
   checkpoint directory, and the sampler loads it in place with vLLM's ``reload_weights``: over
   ``POST /collective_rpc`` for the server, by ``LLM.collective_rpc`` in colocate mode; the
   server's prefix cache is reset as TRL does. ``init_communicator`` does nothing.
2. **The tied output layer.** The demo model ties ``lm_head`` to the embedding; vLLM's CPU build
   keeps a oneDNN handle built from the embedding as it was at load time and ``reload_weights``
   rebuilds none for a layer it loads no weight into. The reload is agentrl's vLLM worker
   extension's ``agentrl_reload_weights`` (``agentrl/client/vllm_worker``, used unchanged, on the
   server's ``PYTHONPATH`` and in colocate mode's ``worker_extension_cls``), which rebuilds it.
3. **float32.** vLLM's ``dtype="auto"`` serves the float32 checkpoint in 16 bits on a CPU; the
   server is started with ``--dtype float32`` and colocate mode's ``LLM`` gets ``dtype="float32"``
   (and ``enforce_eager``, as agentrl's vLLM servers on a CPU).
4. **The server's key.** The server binds 127.0.0.1 and needs a key on every route (agentrl's
   ``agentrl_vllm_auth.RequireKey`` middleware, unchanged); TRL's ``VLLMClient`` sends it.

The check that the sync works: TRL's importance-sampling correction (on by default with vLLM)
scores every sampled token with the trainer's model after each sync; ``logp_gap`` reads the
largest gap between the sampler's and the trainer's log-probabilities of the step just made, and
the worker fails the run when it is above its tolerance.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORKER_DIR = ROOT / "agentrl" / "client" / "vllm_worker"  # agentrl's vLLM worker extension and key middleware
WORKER_EXTENSION = "agentrl_vllm_worker.WorkerExtension"
RELOAD = "agentrl_reload_weights"
LOGP_GAP = "sampling/sampling_logp_difference/max"  # TRL's per-step metric: max |trainer - sampler| logprob


class FileSync:
    """Two copies of the checkpoint directory, written in turn: the one being loaded is never
    the one being written."""

    def __init__(self, model_dir: Path, out: Path) -> None:
        self.dirs = [out / "sync_a", out / "sync_b"]
        for d in self.dirs:
            shutil.copytree(model_dir, d, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.safetensors"))
        self.turn = 0
        self.seconds = 0.0  # time spent writing, summed
        self.syncs = 0

    def write(self, named_params: Any) -> str:
        from safetensors.torch import save_file

        t0 = time.perf_counter()
        target = self.dirs[self.turn % 2]
        self.turn += 1
        tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in named_params}
        save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
        self.seconds += time.perf_counter() - t0
        self.syncs += 1
        return str(target)


def vllm_env(threads: int) -> dict[str, str]:
    """vLLM's CPU settings, as agentrl's vLLM servers on a CPU have them."""
    return {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(threads)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(model_dir: Path, threads: int, seed: int, log: Path) -> tuple[subprocess.Popen, str, str]:
    """vLLM's OpenAI server as ``trl vllm-serve`` starts it (dev mode, processed logprobs), but
    float32, with the file reload and a key instead of the NCCL weight-transfer engine. Returns
    the process, its key and its URL once ``/health`` answers."""
    import requests

    key, port = secrets.token_urlsafe(24), free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
           "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1", "--seed", str(seed),
           "--worker-extension-cls", WORKER_EXTENSION, "--middleware", "agentrl_vllm_auth.RequireKey",
           "--disable-uvicorn-access-log"]
    env = {**os.environ, **vllm_env(threads), "VLLM_SERVER_DEV_MODE": "1", "VLLM_API_KEY": key,
           "PYTHONPATH": os.pathsep.join(p for p in (str(WORKER_DIR), os.environ.get("PYTHONPATH")) if p)}
    out = open(log, "w")  # noqa: SIM115 (the server writes it for as long as it runs)
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"trl_vllm: the vLLM server exited with code {proc.returncode}; see {log}")
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return proc, key, f"http://127.0.0.1:{port}"
        except requests.RequestException:
            pass
        time.sleep(1)
    proc.kill()
    sys.exit(f"trl_vllm: the vLLM server did not answer /health within 300 s; see {log}")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def check_reload(results: Any, where: str) -> None:
    """``agentrl_reload_weights`` answers, per worker, how many embedding kernels it rebuilt."""
    if not results or any(r is None for r in results):
        raise RuntimeError(f"trl_vllm: the reload by {where} answered {results!r}; expected one count per worker")


def patch_server_mode(key: str, sync: FileSync) -> None:
    """TRL's ``VLLMClient`` with the key and no NCCL group; ``sync_weights`` through ``sync``."""
    from unittest import mock

    import requests
    from trl.generation import vllm_client, vllm_generation

    class KeyedSession(requests.Session):
        def __init__(self) -> None:
            super().__init__()
            self.headers["Authorization"] = f"Bearer {key}"

    original_init = vllm_client.VLLMClient.__init__

    def keyed_init(self: Any, *args: Any, **kwargs: Any) -> None:
        with mock.patch.object(vllm_client.requests, "Session", KeyedSession):
            original_init(self, *args, **kwargs)

    def sync_weights(self: Any) -> None:
        path = sync.write(self._iter_named_params())
        answer = self.vllm_client._post(f"{self.vllm_client.base_url}/collective_rpc",
                                        json={"method": RELOAD, "args": [path]}, timeout=300)
        check_reload(answer.get("results"), "POST /collective_rpc")
        self.vllm_client.reset_prefix_cache()

    vllm_client.VLLMClient.__init__ = keyed_init
    vllm_client.VLLMClient.init_communicator = lambda self, device=0: None
    vllm_generation.VLLMGeneration.sync_weights = sync_weights


def patch_colocate_mode(sync: FileSync, threads: int) -> None:
    """TRL's in-process ``LLM`` in float32 with agentrl's worker extension; ``sync_weights``
    through ``sync``."""
    from trl.generation import vllm_generation

    os.environ.update(vllm_env(threads))
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # one process: TRL reaches into the engine's worker
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(WORKER_DIR), os.environ.get("PYTHONPATH")) if p)
    if str(WORKER_DIR) not in sys.path:
        sys.path.insert(0, str(WORKER_DIR))
    llm_class = vllm_generation.LLM

    def float32_llm(*args: Any, **kwargs: Any) -> Any:
        kwargs.update(dtype="float32", enforce_eager=True, worker_extension_cls=WORKER_EXTENSION)
        return llm_class(*args, **kwargs)

    def sync_weights(self: Any) -> None:
        path = sync.write(self._iter_named_params())
        check_reload(self.llm.collective_rpc(RELOAD, args=(path,)), "LLM.collective_rpc")
        self.llm.reset_prefix_cache()

    vllm_generation.LLM = float32_llm
    vllm_generation.VLLMGeneration.sync_weights = sync_weights


def logp_gap(trainer: Any) -> float | None:
    """The largest |trainer - sampler| log-probability of the step just made (TRL's metric, read
    before TRL's logging averages it away), or None when TRL recorded none."""
    values = trainer._metrics.get("train", {}).get(LOGP_GAP)
    return float(values[-1]) if values else None

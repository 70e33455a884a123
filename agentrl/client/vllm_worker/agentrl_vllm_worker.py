"""Runs inside vLLM's worker processes, not agentrl's: a vLLM server that agentrl starts is
launched with ``--worker-extension-cls agentrl_vllm_worker.WorkerExtension`` and this directory
on its ``PYTHONPATH``, so vLLM imports this module from its own environment. It imports
nothing of agentrl's (vLLM's environment has no agentrl) and adds one ``/collective_rpc``
method, which ``RemoteEngine.update_weights`` calls in place of vLLM's ``reload_weights``.

``agentrl_reload_weights(weights_path)``: vLLM's in-place ``reload_weights``, then a fresh CPU
GEMM kernel for every embedding-kind layer that computes logits through one. vLLM's CPU build
(0.32) builds a oneDNN handle from a layer's weight when the model loads
(``vllm/model_executor/layers/utils.py``, ``dispatch_cpu_unquantized_gemm``), and the handle
keeps the weight as it was then. The reload rebuilds the handle of every layer it loads
weights into, but a tied ``lm_head`` loads none of its own (its weight is the embedding's; a
tied checkpoint has no ``lm_head.weight``), so without the second step its handle keeps
computing logits from the embedding the server started with. On a GPU no layer has such a
handle, and the second step rebuilds nothing.
"""

from __future__ import annotations

from typing import Any


class WorkerExtension:
    """Mixed into vLLM's worker class by vLLM (``--worker-extension-cls``)."""

    def agentrl_reload_weights(self: Any, weights_path: str) -> int:
        """Load the checkpoint at ``weights_path`` in place; returns how many layers' CPU
        kernels were rebuilt from the weights just loaded (0 on a GPU)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

        self.reload_weights(weights_path=weights_path)
        rebuilt = 0
        with set_current_vllm_config(self.vllm_config):
            for module in self.model_runner.get_model().modules():
                method = getattr(module, "quant_method", None)
                if hasattr(module, "cpu_linear") and isinstance(method, UnquantizedEmbeddingMethod):
                    method.process_weights_after_loading(module)
                    rebuilt += 1
        return rebuilt

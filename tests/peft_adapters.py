"""A peft LoRA adapter with random, non-zero A and B — one that changes what the model samples —
for the tests that serve adapters (tests/inference, tests/vllm)."""

from __future__ import annotations

from pathlib import Path

ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def random_adapter(model_dir: Path, out: Path, *, seed: int = 0, rank: int = 8,
                   targets: list[str] = ALL_PROJECTIONS) -> Path:
    """peft's adapter on ``model_dir`` (``lora_alpha`` 2 x rank) at ``out``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                           LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, init_lora_weights=False))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.mul_(3.0)  # peft's random init, scaled: large enough to change the tiny models' samples
    model.save_pretrained(out)
    return out

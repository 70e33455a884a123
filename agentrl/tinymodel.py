"""The tiny demo model: a Qwen2-architecture causal LM of about a million parameters.

What it is: the model agentrl's demo, tests and benchmarks run on a CPU. ``init_tiny_model``
writes an untrained model plus the byte-level tokenizer (``agentrl.tokenizer``) to a
directory that ``transformers.AutoModelForCausalLM`` / ``AutoTokenizer`` load offline.
"""

from __future__ import annotations

from pathlib import Path

from agentrl.tokenizer import END, PAD, VOCAB_SIZE, save_tokenizer, special_token_ids


def tiny_config(hidden_size: int = 128, num_layers: int = 5, max_positions: int = 1024):
    """Qwen2 config of the demo model (vocab padded to a multiple of 8)."""
    from transformers import Qwen2Config

    ids = special_token_ids()
    return Qwen2Config(
        vocab_size=(VOCAB_SIZE + 7) // 8 * 8,
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=ids[END],
        pad_token_id=ids[PAD],
    )


def init_tiny_model(out_dir: str | Path, seed: int = 0, **config_kwargs):
    """Write an untrained tiny model and its tokenizer to ``out_dir``; returns the model."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(**config_kwargs))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    save_tokenizer(out)
    return model

"""The tiny demo model: its byte-level tokenizer, its task data, and how it is built.

    tokenizer.py   the byte-level tokenizer and chat template (ids are raw bytes + specials)
    arith_data.py  the arithmetic task family the model is trained on and RL draws from
    tinymodel.py   ``agentrl model tiny``: a ~1 M-parameter Qwen2 built and SFT-trained from
                   scratch, and its evaluation

Nothing here is needed to train another model: any HF causal LM checkpoint works.
"""

from agentrl.model.tinymodel import TinyModelConfig, build_tiny_model, evaluate_model_dir, init_tiny_model
from agentrl.model.tokenizer import build_tokenizer

__all__ = ["TinyModelConfig", "build_tiny_model", "build_tokenizer", "evaluate_model_dir", "init_tiny_model"]

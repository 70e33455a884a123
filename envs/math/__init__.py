"""Math task family: the verifier (``math_reward_fn``) and the Math / MathRetry environments.

    verifier.py  is a model's final answer equal to the gold answer?
    numbers.py   numbers as written in math answers, and when two of them are equal
    pool.py      killable worker processes that run the verifier; ``math_reward_fn``
    env.py       MathEnv, MathRetryEnv: word problems graded by the verifier

``math_reward_fn(response, gold) -> float`` is the reward most users want on its own; the
environments in ``envs.math.env`` wrap it in Gymnasium's API.
"""

from envs.math.env import MathEnv, MathRetryEnv
from envs.math.pool import VerifierConfig, VerifierPool, amath_reward_fn, math_reward_fn
from envs.math.verifier import compare, extract_final_answer, normalize_gold

__all__ = [
    "MathEnv",
    "MathRetryEnv",
    "VerifierConfig",
    "VerifierPool",
    "amath_reward_fn",
    "compare",
    "extract_final_answer",
    "math_reward_fn",
    "normalize_gold",
]

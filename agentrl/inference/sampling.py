"""Token sampling for the embedded engine: temperature, top-k, top-p, and exact logprobs.

What it is: one pure, batched function, ``sample_rows``, that turns a step's logits into
one token per row *and* the log-probability of that token under the distribution the token
was really drawn from. Each row has its own settings; the randomness comes in as one
uniform number per row (drawn by the engine from the request's own seeded RNG), so a seeded
request samples the same tokens whatever else shares its batch.

The distribution of a row, in order (SGLang's order):
  1. ``logits / temperature``; temperature 0 means greedy, i.e. top-k = 1;
  2. top-k: keep the k most likely tokens (``top_k < 1`` or ``>= V`` keeps all);
  3. top-p: keep the smallest prefix of the sorted tokens whose probability mass (under
     step 1, before renormalizing) reaches ``top_p`` — the most likely token is always kept;
  4. renormalize over what is kept. The returned logprob is ``log p(token)`` under this
     final distribution; for greedy rows the distribution is a point mass, so it is 0.0.

What it is not: penalties (frequency/presence/repetition), min-p, logit bias or grammars.
"""

from __future__ import annotations

import torch

GREEDY_EPS = 1e-6
"""Temperatures below this are greedy (SGLang's threshold)."""


def sample_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    uniform: torch.Tensor,
    top_n: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """Sample one token per row of ``logits`` ``[B, V]`` (float32).

    ``temperature``, ``top_p`` (float) and ``top_k`` (long; < 1 means no cut) are ``[B]``;
    ``uniform`` ``[B]`` in [0, 1) drives inverse-CDF sampling. Returns ``tokens`` ``[B]``,
    ``logprobs`` ``[B]`` and, when ``top_n > 0``, the ``top_n`` most likely (logprob, token
    id) pairs of each row's final distribution (``[B, top_n]`` each).
    """
    B, V = logits.shape
    greedy = temperature < GREEDY_EPS
    temp = torch.where(greedy, torch.ones_like(temperature), temperature)
    scaled = logits / temp[:, None]
    k = torch.where((top_k < 1) | (top_k > V), torch.full_like(top_k, V), top_k)
    k = torch.where(greedy, torch.ones_like(k), k)
    needs_sort = bool((k < V).any()) or bool((top_p < 1.0).any())
    if needs_sort:
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        rank = torch.arange(V, device=logits.device)[None, :]
        keep = (rank < k[:, None]) & ((mass_before < top_p[:, None]) | (rank == 0))
        filtered = sorted_logits.masked_fill(~keep, float("-inf"))
    else:
        order = None
        filtered = scaled
    logp = filtered.log_softmax(dim=-1)
    cdf = logp.exp().cumsum(dim=-1)
    pick = torch.searchsorted(cdf, (uniform * cdf[:, -1]).unsqueeze(-1).contiguous()).squeeze(-1)
    pick = pick.clamp_(max=V - 1)
    # A zero-probability token can only be reached through float rounding at the top of the
    # CDF; step back to the last kept token.
    while True:
        bad = torch.isinf(logp.gather(1, pick[:, None]).squeeze(1))
        if not bool(bad.any()):
            break
        pick = torch.where(bad, pick - 1, pick)
    top_logp = logp.gather(1, pick[:, None]).squeeze(1)
    tokens = order.gather(1, pick[:, None]).squeeze(1) if order is not None else pick
    top = None
    if top_n > 0:
        vals, idx = logp.topk(min(top_n, V), dim=-1)
        top = (vals, order.gather(1, idx) if order is not None else idx)
    return tokens, top_logp, top

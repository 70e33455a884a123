"""Token sampling for the embedded engine: penalties, temperature, top-k, top-p, min-p, exact logprobs.

What it is: one pure, batched function, ``sample_rows``, that turns a step's logits into
one token per row *and* the log-probability of that token under the distribution the token
was really drawn from. Each row has its own settings; the randomness comes in as one
uniform number per row (drawn by the engine from the request's own seeded RNG), so a seeded
request samples the same tokens whatever else shares its batch.

The distribution of a row, in order (SGLang's order):
  0. ``penalize`` (only for the rows that ask for it; the engine passes the result on as the
     row's logits): frequency and presence penalties and ``min_new_tokens`` (EOS and stop
     ids at -inf) are added, the repetition penalty scales the logits of tokens already in
     the output (divides a positive logit, multiplies a negative one), then ``logit_bias`` is
     added. Penalties count the *output* tokens of the request, as SGLang's penalizers do;
  1. ``logits / temperature``; temperature 0 means greedy, i.e. top-k = 1;
  2. top-k: keep the k most likely tokens (``top_k < 1`` or ``>= V`` keeps all);
  3. top-p: keep the smallest prefix of the sorted tokens whose probability mass (under
     step 1, before renormalizing) reaches ``top_p`` — the most likely token is always kept;
  4. min-p: of those, keep the tokens whose probability (under step 1) is at least ``min_p``
     times the most likely one's;
  5. renormalize over what is kept. The returned logprob is ``log p(token)`` under this
     final distribution — penalties and bias included, since the token was drawn from it;
     for greedy rows the distribution is a point mass, so it is 0.0.

Extreme but valid settings (a repetition penalty of 5e-324, a temperature of 1e300) would
overflow a logit to +inf, and one +inf or inf/inf makes its whole row NaN: logits are kept at
or below the largest float (overflowed ones tie there), so every logprob is finite or -inf.

So a penalised request's logprobs are those of the penalised policy, not of the model: a
trainer that recomputes them from the model sees the difference as off-policy-ness (the
decoupled PPO loss's behaviour logprobs are these).

What it is not: grammars (regex, JSON schema, EBNF) or custom logit processors.
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
    min_p: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """Sample one token per row of ``logits`` ``[B, V]`` (float32).

    ``temperature``, ``top_p``, ``min_p`` (float; None: 0) and ``top_k`` (long; < 1 means no cut) are ``[B]``;
    ``uniform`` ``[B]`` in [0, 1) drives inverse-CDF sampling. Returns ``tokens`` ``[B]``,
    ``logprobs`` ``[B]`` and, when ``top_n > 0``, the ``top_n`` most likely (logprob, token
    id) pairs of each row's final distribution (``[B, top_n]`` each).
    """
    B, V = logits.shape
    greedy = temperature < GREEDY_EPS
    top = torch.finfo(logits.dtype).max
    temp = torch.where(greedy, torch.ones_like(temperature), temperature).clamp(max=top)
    # a large logit over a small temperature overflows to +inf, and one +inf makes its row NaN
    # (inf - inf in the softmax): such logits are kept at the largest float, tied
    scaled = (logits / temp[:, None]).clamp_(max=top)
    k = torch.where((top_k < 1) | (top_k > V), torch.full_like(top_k, V), top_k)
    k = torch.where(greedy, torch.ones_like(k), k)
    use_min_p = min_p is not None and bool((min_p > 0).any())
    needs_sort = bool((k < V).any()) or bool((top_p < 1.0).any()) or use_min_p
    if needs_sort:
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        rank = torch.arange(V, device=logits.device)[None, :]
        keep = (rank < k[:, None]) & ((mass_before < top_p[:, None]) | (rank == 0))
        if use_min_p:
            keep &= probs >= probs[:, :1] * min_p[:, None]
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


def penalize(
    logits: torch.Tensor,
    counts: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    repetition: torch.Tensor,
    banned: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Step 0 of the module docstring for ``logits`` ``[B, V]``: a new tensor.

    ``counts`` ``[B, V]``: occurrences of each token in the row's output so far;
    ``frequency``, ``presence``, ``repetition`` ``[B]``; ``banned`` ``[B, V]`` bool: tokens at
    -inf (EOS and stop ids before ``min_new_tokens``); ``bias`` ``[B, V]``: the logit bias.
    """
    seen = counts > 0
    out = logits - frequency[:, None] * counts - presence[:, None] * seen
    if banned is not None:
        out = out.masked_fill(banned, float("-inf"))
    # a penalty below the dtype's smallest normal number (5e-324 is a valid request: (0, 2])
    # would round to 0 and divide by it; a positive logit over a tiny one overflows: kept at the
    # largest float (-inf stays: banned tokens)
    tiny, top = torch.finfo(out.dtype).tiny, torch.finfo(out.dtype).max
    scale = torch.where(seen, repetition[:, None].clamp(min=tiny).expand_as(out), torch.ones_like(out))
    out = torch.where(out < 0, out * scale, out / scale)
    if bias is not None:
        out = out + bias
    return out.clamp_(max=top)

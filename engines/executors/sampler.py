"""Turn one logits row per sampling request into a token id.

Greedy (temperature 0) is argmax. Otherwise logits are divided by the temperature,
cut by top-k and top-p, and sampled with the "exponential race": argmax(p / E) with
E ~ Exp(1) per token picks token i with probability p_i, so the whole batch samples with
one noise tensor and one argmax. A seeded request draws its noise from its own
`torch.Generator` (kept in `request.rng`), so its tokens depend only on its seed and its
own logits, never on what else is in the batch.

Before either, a request's penalties and logit bias adjust its row
(engines/executors/logit_adjust.py), then a constrained request's grammar mask sets the
tokens it may not pick to -inf (engines/grammar.py). A request that asks for log-probabilities gets
them from the model's raw logits (vLLM's default: before penalties, bias, temperature
and cuts) in `request.sampled_logprobs`: the chosen token's and the top k.
"""
from __future__ import annotations

import torch

from engines.executors.logit_adjust import adjust_logits, apply_mask
from engines.grammar import GrammarMask
from engines.request import Request
from ipc.messages import TokenLogprobs


def _generator(request: Request, device: torch.device) -> torch.Generator:
    if request.rng is None:
        request.rng = torch.Generator(device=device).manual_seed(request.sampling.seed)
    return request.rng


def _cut(logits: torch.Tensor, top_k: torch.Tensor | None,
         top_p: torch.Tensor | None) -> torch.Tensor:
    """Set to -inf every logit outside the row's top-k and outside its top-p mass."""
    ordered, order = logits.sort(dim=-1, descending=True)
    if top_k is not None:
        kth = ordered.gather(1, (top_k - 1).unsqueeze(1))
        ordered = ordered.masked_fill(ordered < kth, float("-inf"))
    if top_p is not None:
        probs = ordered.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # the top token always survives
        ordered = ordered.masked_fill(mass_before > top_p.unsqueeze(1), float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter_(1, order, ordered)


def record_logprobs(logits: torch.Tensor, tokens: torch.Tensor, requests: list[Request]) -> None:
    """Set `sampled_logprobs` of every request that asks: log-softmax of its raw row."""
    rows = [i for i, r in enumerate(requests) if r.sampling.logprobs is not None]
    if not rows:
        return
    at = torch.tensor(rows, device=logits.device)
    logprobs = logits[at].float().log_softmax(dim=-1)
    chosen = logprobs.gather(1, tokens[at].unsqueeze(1)).squeeze(1).tolist()
    k = min(max(requests[i].sampling.logprobs for i in rows), logprobs.shape[-1])
    top_values, top_ids = logprobs.topk(k, dim=-1) if k else (logprobs[:, :0], logprobs[:, :0])
    top_values, top_ids = top_values.tolist(), top_ids.long().tolist()
    for n, i in enumerate(rows):
        want = requests[i].sampling.logprobs
        requests[i].sampled_logprobs = TokenLogprobs(chosen[n], top_ids[n][:want],
                                                     top_values[n][:want])


class Sampler:
    def __call__(self, logits: torch.Tensor, requests: list[Request],
                 mask: GrammarMask | None = None) -> list[int]:
        """logits: [len(requests), vocab] -> one token id per request; `mask`: the
        constrained rows' allowed tokens."""
        params = [r.sampling for r in requests]
        adjusted = logits
        if any(p.changes_logits for p in params):
            adjusted = adjust_logits(logits.float(), requests)
        if mask is not None:
            if adjusted is logits and any(p.logprobs is not None for p in params):
                adjusted = logits.clone()  # log-probabilities come from the raw logits
            adjusted = apply_mask(adjusted, mask)
        if all(p.temperature == 0.0 for p in params):
            tokens = adjusted.argmax(dim=-1)
        else:
            tokens = self._sample(adjusted.float(), requests, params)
        if any(p.logprobs is not None for p in params):
            record_logprobs(logits, tokens, requests)
        return tokens.tolist()

    def _sample(self, logits, requests, params) -> torch.Tensor:
        device, vocab = logits.device, logits.shape[-1]
        greedy = torch.tensor([p.temperature == 0.0 for p in params], device=device)
        temps = torch.tensor([p.temperature or 1.0 for p in params], device=device)
        scaled = logits / temps.unsqueeze(1)
        top_k = top_p = None
        if any(0 < p.top_k < vocab for p in params):
            top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params],
                                 device=device)
        if any(p.top_p < 1.0 for p in params):
            top_p = torch.tensor([p.top_p for p in params], device=device)
        if top_k is not None or top_p is not None:
            scaled = _cut(scaled, top_k, top_p)
        probs = scaled.softmax(dim=-1)
        noise = torch.empty_like(probs).exponential_()
        for row, (request, p) in enumerate(zip(requests, params)):
            if p.seed is not None and p.temperature > 0.0:
                noise[row].exponential_(generator=_generator(request, device))
        sampled = (probs / noise.clamp_min_(1e-20)).argmax(dim=-1)
        return torch.where(greedy, logits.argmax(dim=-1), sampled)

"""What a request's own parameters do to its logits before a token is chosen.

As OpenAI defines them (and vLLM applies them): for every token j the request has
generated c[j] times so far (its prompt does not count),

    logit[j] -= frequency_penalty * c[j] + presence_penalty * (c[j] > 0)

and then `logit_bias[j]` is added. Greedy takes the argmax of the adjusted logits;
sampling divides them by the temperature. Rows of requests that ask for none of this
are left as they are.

A constrained request's grammar (engines/grammar.py) then leaves it only the tokens its
mask allows: `apply_mask`, one masked_fill over the constrained rows of the batch.
"""
from __future__ import annotations

import torch

from engines.grammar import GrammarMask
from engines.request import Request

_SHIFTS = torch.arange(32, dtype=torch.int32)


def adjust_logits(logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
    """`logits` [len(requests), vocab] (float) with penalties and biases applied (a new
    tensor when any row changes, else `logits` itself)."""
    rows = [i for i, r in enumerate(requests) if r.sampling.changes_logits]
    if not rows:
        return logits
    logits = logits.clone()
    _penalize(logits, [(i, requests[i]) for i in rows
                       if requests[i].sampling.presence_penalty
                       or requests[i].sampling.frequency_penalty])
    _bias(logits, [(i, requests[i]) for i in rows if requests[i].sampling.logit_bias])
    return logits


def _penalize(logits: torch.Tensor, rows: list[tuple[int, Request]]) -> None:
    if not rows:
        return
    vocab, device = logits.shape[-1], logits.device
    counts = torch.zeros((len(rows), vocab), dtype=logits.dtype, device=device)
    index_rows, index_tokens = [], []
    for k, (_, request) in enumerate(rows):
        generated = [t for t in request.generated_token_ids if 0 <= t < vocab]
        index_rows.extend([k] * len(generated))
        index_tokens.extend(generated)
    if index_tokens:
        counts.index_put_((torch.tensor(index_rows, device=device),
                           torch.tensor(index_tokens, device=device)),
                          torch.ones(len(index_tokens), dtype=logits.dtype, device=device),
                          accumulate=True)
    frequency = torch.tensor([r.sampling.frequency_penalty for _, r in rows],
                             dtype=logits.dtype, device=device).unsqueeze(1)
    presence = torch.tensor([r.sampling.presence_penalty for _, r in rows],
                            dtype=logits.dtype, device=device).unsqueeze(1)
    at = torch.tensor([i for i, _ in rows], device=device)
    logits[at] -= frequency * counts + presence * (counts > 0).to(logits.dtype)


def _bias(logits: torch.Tensor, rows: list[tuple[int, Request]]) -> None:
    if not rows:
        return
    vocab, device = logits.shape[-1], logits.device
    index_rows, index_tokens, values = [], [], []
    for i, request in rows:
        for token, bias in request.sampling.logit_bias.items():
            if 0 <= token < vocab:  # the API checks ids against the vocabulary
                index_rows.append(i)
                index_tokens.append(token)
                values.append(bias)
    if values:
        logits.index_put_((torch.tensor(index_rows, device=device),
                           torch.tensor(index_tokens, device=device)),
                          torch.tensor(values, dtype=logits.dtype, device=device),
                          accumulate=True)


def apply_mask(logits: torch.Tensor, mask: GrammarMask) -> torch.Tensor:
    """`logits` [rows, vocab] with every token a constrained row may not pick at -inf, in
    place. The packed bits go to the logits' device and are unpacked there (32 tokens per
    int32 word); logits past the tokenizer's vocabulary (padding) are disallowed too."""
    device, width = logits.device, logits.shape[-1]
    bits = torch.from_numpy(mask.bits).to(device, non_blocking=True)
    allowed = ((bits.unsqueeze(-1) >> _SHIFTS.to(device)) & 1).bool().flatten(1)
    allowed = allowed[:, :min(width, mask.vocab_size)]
    if allowed.shape[-1] < width:
        allowed = torch.nn.functional.pad(allowed, (0, width - allowed.shape[-1]), value=False)
    if len(mask.rows) == logits.shape[0]:
        return logits.masked_fill_(~allowed, float("-inf"))
    at = torch.tensor(mask.rows, device=device)
    logits[at] = logits[at].masked_fill(~allowed, float("-inf"))
    return logits

"""The attention backends agree on a mixed batch over a scattered paged cache.

flash-attn needs CUDA, so its backend runs here against a stand-in `flash_attn` module: a
plain-torch reference of `flash_attn_varlen_func` written from its documented contract
(packed varlen q/k/v, cu_seqlens, bottom-right-aligned causal mask, optional paged K/V via
`block_table`). This checks the metadata our backend builds, not the CUDA kernel.
"""
from __future__ import annotations

import random
import sys
import types

import pytest
import torch

from engines.models.attention import FlashAttention, SdpaAttention, SeqSpec

BLOCK, HEADS, KV_HEADS, DIM, BLOCKS = 4, 8, 2, 16, 64


def reference_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     causal=False, block_table=None):
    outs = []
    for b in range(len(cu_seqlens_q) - 1):
        q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        k_len = int(cu_seqlens_k[b + 1] - cu_seqlens_k[b])
        if block_table is None:
            k0 = int(cu_seqlens_k[b])
            keys, values = k[k0:k0 + k_len], v[k0:k0 + k_len]
        else:
            blocks = block_table[b].long()
            keys = k[blocks].flatten(0, 1)[:k_len]
            values = v[blocks].flatten(0, 1)[:k_len]
        group = q.shape[1] // keys.shape[1]
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q[q0:q1], keys) / q.shape[-1] ** 0.5
        n = q1 - q0
        allowed = torch.arange(k_len)[None, :] <= torch.arange(n)[:, None] + (k_len - n)
        scores = scores.masked_fill(~allowed, float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), values))
    return torch.cat(outs)


@pytest.fixture
def fake_flash_attn(monkeypatch):
    module = types.ModuleType("flash_attn")
    module.flash_attn_varlen_func = reference_varlen
    monkeypatch.setitem(sys.modules, "flash_attn", module)


def mixed_batch(rng: random.Random) -> list[SeqSpec]:
    """Decodes first, then a chunk continuing cached context, then a fresh prefill."""
    free = list(range(BLOCKS))
    rng.shuffle(free)
    seqs = []
    for start, n in ((9, 1), (2, 1), (17, 1), (6, 5), (0, 7)):
        table = [free.pop() for _ in range(-(-(start + n) // BLOCK))]
        seqs.append(SeqSpec(start, n, table))
    return seqs


def run(backend, seqs, caches, q, k, v):
    k_cache, v_cache = (c.clone() for c in caches)
    out = backend(q, k, v, k_cache, v_cache, backend.build(seqs))
    return out, k_cache


@pytest.mark.parametrize("paged", [True, False])
def test_flash_backend_matches_sdpa(fake_flash_attn, paged):
    torch.manual_seed(0)
    seqs = mixed_batch(random.Random(0))
    tokens = sum(s.num_tokens for s in seqs)
    shape = (BLOCKS, BLOCK, KV_HEADS, DIM)
    caches = (torch.randn(shape), torch.randn(shape))  # earlier context: random but fixed
    q = torch.randn(tokens, HEADS, DIM)
    k, v = torch.randn(tokens, KV_HEADS, DIM), torch.randn(tokens, KV_HEADS, DIM)
    device = torch.device("cpu")
    expected, expected_cache = run(SdpaAttention(BLOCK, device), seqs, caches, q, k, v)
    got, got_cache = run(FlashAttention(BLOCK, device, paged=paged), seqs, caches, q, k, v)
    assert torch.allclose(got, expected, atol=1e-5)
    assert torch.equal(got_cache, expected_cache)

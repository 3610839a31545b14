"""The attention backends agree on a mixed batch over a scattered paged cache, and with a
plain reference of varlen attention.

flash-attn needs CUDA, so its backend runs here against a stand-in `flash_attn` module: a
plain-torch reference of `flash_attn_varlen_func` written from its documented contract
(packed varlen q/k/v, cu_seqlens, bottom-right-aligned causal mask, optional paged K/V via
`block_table`). This checks the metadata our backend builds, not the CUDA kernel.

Covers: engines/models/attention.py, engines/models/sdpa_attention.py.
"""
from __future__ import annotations

import itertools
import random
import sys
import types

import pytest
import torch

from engines.models.attention import FlashAttention, SdpaAttention, SeqSpec
from engines.models.paged_kv import padded_tables, slot_mapping, write_cache
from engines.models.sdpa_attention import length_groups

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


def test_sdpa_backend_matches_reference_on_spread_decodes_and_batched_prefills():
    """Decodes of very different lengths are cut into several runs, fresh prefill chunks of one
    length share a call, and every row still equals plain varlen attention over the cache."""
    rng = random.Random(1)
    pool = 4096
    free = list(range(pool))
    rng.shuffle(free)
    decode_lengths = sorted((rng.randrange(1, 1000) for _ in range(12)), reverse=True)
    chunks = [(n - 1, 1) for n in decode_lengths] + [(0, 6), (0, 6), (0, 6), (11, 5), (0, 3)]
    seqs = [SeqSpec(start, n, [free.pop() for _ in range(-(-(start + n) // BLOCK))])
            for start, n in chunks]
    backend = SdpaAttention(BLOCK, torch.device("cpu"))
    meta = backend.build(seqs)
    assert len(meta.decodes) > 1, "spread lengths make several runs"
    runs = [(g.row_start, g.row_end) for g in meta.decodes]
    assert runs[0][0] == 0 and runs[-1][1] == 12
    assert all(a[1] == b[0] for a, b in itertools.pairwise(runs))
    assert [s.num_seqs for s in meta.prefills] == [3, 1, 1]

    torch.manual_seed(1)
    tokens = sum(n for _, n in chunks)
    shape = (pool, BLOCK, KV_HEADS, DIM)
    caches = (torch.randn(shape), torch.randn(shape))
    q = torch.randn(tokens, HEADS, DIM)
    k, v = torch.randn(tokens, KV_HEADS, DIM), torch.randn(tokens, KV_HEADS, DIM)
    got, got_cache = run(backend, seqs, caches, q, k, v)

    k_cache, v_cache = (c.clone() for c in caches)
    write_cache(k, v, k_cache, v_cache, torch.tensor(slot_mapping(seqs, BLOCK)))
    cu_q = torch.tensor([0] + [n for _, n in chunks]).cumsum(0)
    cu_k = torch.tensor([0] + [s + n for s, n in chunks]).cumsum(0)
    width = max(len(s.block_table) for s in seqs)
    expected = reference_varlen(q, k_cache, v_cache, cu_q, cu_k, None, None, causal=True,
                                block_table=padded_tables(seqs, width))
    assert torch.allclose(got, expected.reshape(tokens, -1), atol=1e-5)
    assert torch.equal(got_cache, k_cache)


def test_length_groups_cut_only_where_padding_costs_more_than_a_call():
    assert length_groups([130] * 16, 16) == [(0, 16)]
    assert length_groups([20, 12, 5, 1], 16) == [(0, 4)]  # little padding to save
    spread = list(range(1000, 0, -60))  # 1000, 940, ..., 40: falling off gradually
    groups = length_groups(spread, 16)
    assert 2 <= len(groups) <= 6
    assert groups[0][0] == 0 and groups[-1][1] == len(spread)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(groups))

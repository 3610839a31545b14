"""The Triton paged decode kernel and the CUDA attention backend built on it.

On a CUDA machine they run natively (bf16 and fp16); here, without a GPU, through Triton's
interpreter (numpy, float32 and fp16 only: the interpreter has no bfloat16), which runs
the same kernel code, so the indexing into scattered blocks, the split-KV merge and the
padding rows are checked on every CI run.

Covers: engines/models/paged_decode.py, engines/models/triton_attention.py.
"""
from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined
pytest.importorskip("triton")

from engines.models.paged_decode import (MAX_SPLITS, DecodeTuning, num_splits,  # noqa: E402
                                         paged_decode_attention)
from engines.models.paged_kv import SeqSpec, slot_mapping  # noqa: E402
from engines.models.sdpa_attention import SdpaAttention  # noqa: E402
from engines.models.triton_attention import TritonAttention, decode_arrays  # noqa: E402
from tests.test_attention_backends import reference_varlen  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [torch.bfloat16, torch.float16] if DEVICE.type == "cuda" else [torch.float32,
                                                                         torch.float16]


def reference_decode(q, k_cache, v_cache, tables, lens):
    """float64 attention of each sequence's one query over its first lens[i] positions."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    block = k_cache.shape[1]
    for i, length in enumerate(lens.tolist()):
        if not length:
            continue
        blocks = tables[i, :-(-length // block)].long().cpu()
        keys = k_cache.cpu()[blocks].flatten(0, 1)[:length].double()
        values = v_cache.cpu()[blocks].flatten(0, 1)[:length].double()
        group = q.shape[1] // keys.shape[1]
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
        scores = torch.einsum("hd,khd->hk", q[i].cpu().double(), keys) / q.shape[-1] ** 0.5
        out[i] = torch.einsum("hk,khd->hd", scores.softmax(-1), values)
    return out


def relative_error(got, expected) -> float:
    return float((got.cpu().double() - expected).norm() / expected.norm())


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,dim,block", [(8, 2, 32, 4), (4, 4, 16, 16),
                                                      (32, 8, 64, 16)])
def test_kernel_matches_float64_attention_over_scattered_blocks(dtype, heads, kv_heads, dim,
                                                                block):
    """Random block tables over a shuffled pool, lengths from 0 (a padding row: zeros)
    through several splits, GQA groups of 1 to 4."""
    rng = random.Random(heads * dim + block)
    torch.manual_seed(heads + block)
    num_blocks, seqs = 80, 5
    k_cache = torch.randn(num_blocks, block, kv_heads, dim, dtype=dtype, device=DEVICE)
    v_cache = torch.randn_like(k_cache)
    width = num_blocks // seqs
    lens = [0, 1, block, rng.randrange(2, width * block), width * block]
    tables = torch.randperm(num_blocks)[:seqs * width].view(seqs, width).int().to(DEVICE)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    q = torch.randn(seqs, heads, dim, dtype=dtype, device=DEVICE)
    out = paged_decode_attention(q, k_cache, v_cache, tables, lens_t)
    expected = reference_decode(q, k_cache, v_cache, tables, lens_t)
    assert not out.isnan().any()
    assert torch.equal(out[0].cpu(), torch.zeros_like(out[0].cpu()))
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert relative_error(out, expected) < tolerance


def test_splits_are_many_for_one_sequence_and_one_for_a_large_batch():
    assert num_splits(1, 8) > num_splits(16, 8) > num_splits(64, 8) > num_splits(256, 8) == 1
    assert num_splits(1, 1) == MAX_SPLITS
    assert num_splits(1, 8, DecodeTuning(programs=8)) == 1


@pytest.mark.parametrize("programs", [1, pytest.param(24, marks=pytest.mark.slow),
                                      pytest.param(10_000, marks=pytest.mark.slow)])
def test_the_number_of_splits_and_the_tile_change_nothing(programs):
    """One split per sequence (a long pipelined loop of 16-token tiles) or many short
    ones: the same attention. A CUDA graph's padding row (length 0) still gets zeros."""
    torch.manual_seed(3)
    k_cache = torch.randn(96, 16, 2, 32, device=DEVICE)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(96)[:80].view(4, 20).int().to(DEVICE)
    lens = torch.tensor([17, 320, 3, 0], dtype=torch.int32, device=DEVICE)
    q = torch.randn(4, 8, 32, device=DEVICE)
    out = paged_decode_attention(q, k_cache, v_cache, tables, lens,
                                 tuning=DecodeTuning(tile=16, stages=2, programs=programs))
    expected = reference_decode(q, k_cache, v_cache, tables, lens)
    assert relative_error(out[:3], expected[:3]) < (1e-5 if DEVICE.type == "cpu" else 3e-3)
    assert not out[3].any()


@pytest.mark.slow
def test_backend_matches_sdpa_on_a_mixed_batch():
    """Decodes through the kernel, a chunk continuing its context and fresh prefills
    through SDPA: the same rows and the same cache as the SDPA backend."""
    rng = random.Random(5)
    free = list(range(256))
    rng.shuffle(free)
    chunks = [(40, 1), (9, 1), (0, 1), (23, 1), (11, 6), (0, 5), (0, 5)]
    seqs = [SeqSpec(start, n, [free.pop() for _ in range(-(-(start + n) // 4))])
            for start, n in chunks]
    torch.manual_seed(5)
    tokens = sum(n for _, n in chunks)
    caches = (torch.randn(256, 4, 2, 16, device=DEVICE), torch.randn(256, 4, 2, 16, device=DEVICE))
    q = torch.randn(tokens, 8, 16, device=DEVICE)
    k, v = torch.randn(tokens, 2, 16, device=DEVICE), torch.randn(tokens, 2, 16, device=DEVICE)
    outs = {}
    for backend in (SdpaAttention(4, DEVICE), TritonAttention(4, DEVICE, torch.float32)):
        k_cache, v_cache = (c.clone() for c in caches)
        outs[backend.name] = backend(q, k, v, k_cache, v_cache, backend.build(seqs)), k_cache
    # float32 here: exact in the interpreter; on CUDA Triton's dot rounds through tf32
    tolerance = 1e-5 if DEVICE.type == "cpu" else 3e-3
    assert torch.allclose(outs["triton-paged"][0], outs["sdpa"][0], atol=tolerance)
    assert torch.equal(outs["triton-paged"][1], outs["sdpa"][1])


def test_decode_arrays_give_each_token_its_slot_and_pad_tables_with_block_zero():
    seqs = [SeqSpec(5, 1, [7, 3]), SeqSpec(0, 1, [9])]
    slots, tables, lens = decode_arrays(seqs, 4)
    assert slots.tolist() == slot_mapping(seqs, 4) == [3 * 4 + 1, 9 * 4]
    assert tables.tolist() == [[7, 3], [9, 0]]
    assert lens.tolist() == [6, 1]
    _, wide, _ = decode_arrays(seqs, 4, width=5)
    assert wide.shape == (2, 5)


def test_reference_agrees_with_the_varlen_reference():
    """The float64 reference above is the same function as test_attention_backends' one."""
    torch.manual_seed(7)
    k_cache, v_cache = torch.randn(8, 4, 2, 16), torch.randn(8, 4, 2, 16)
    tables = torch.tensor([[3, 5, 1], [2, 0, 0]], dtype=torch.int32)
    lens = torch.tensor([10, 3], dtype=torch.int32)
    q = torch.randn(2, 4, 16)
    expected = reference_varlen(q, k_cache, v_cache, torch.tensor([0, 1, 2]),
                                torch.tensor([0, 10, 13]), 1, 10, causal=True,
                                block_table=tables)
    assert relative_error(expected, reference_decode(q, k_cache, v_cache, tables, lens)) < 1e-6

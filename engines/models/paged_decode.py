"""Decode attention straight from the paged KV cache: a split-KV Triton kernel (CUDA).

One query token per sequence attends to its whole cached context, read in place from
the scattered blocks (no gather copy). The context is cut into splits of `split` tokens
(flash-decoding): program (sequence, KV head, split) computes the softmax-weighted sum of
its split for all the query heads that share that KV head (GQA: K/V are read once per
group), keeping the running max and sum; a second kernel merges the splits. Small
batches get short splits, so even one sequence fills the GPU.

Shapes are static when the caller fixes `max_context` (a CUDA graph captures the launch
for the longest context it allows; a split past a sequence's end exits at once), and a
sequence of context length 0 (a graph's padding row) gets zeros, not NaN.

flash-attn's paged kernel would do the same, but needs block sizes that are multiples of
256 and has no wheel for every CUDA; Triton ships with PyTorch's CUDA builds.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

#: Tokens one program reads per loop iteration.
TILE = 32
#: Programs wanted for a 1k-token context: about two per streaming multiprocessor of an
#: H100 (132), so a batch of one still keeps the whole GPU reading.
TARGET_PROGRAMS = 264
TYPICAL_CONTEXT = 1024


def split_tokens(num_seqs: int, num_kv_heads: int) -> int:
    """Tokens per split: short for small batches (more programs), long for large ones
    (fewer partial results to merge). A power of two between 64 and 512."""
    split = 64
    while split < 512 and num_seqs * num_kv_heads * TYPICAL_CONTEXT // (2 * split) >= TARGET_PROGRAMS:
        split *= 2
    return split


@triton.jit
def _partial_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, m_ptr, l_ptr, acc_ptr,
                    scale, num_splits,
                    stride_qt, stride_qh, stride_table,
                    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr, SPLIT: tl.constexpr, TILE_N: tl.constexpr):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context = tl.load(lens_ptr + seq)
    begin = split * SPLIT
    end = tl.minimum(begin + SPLIT, context)

    groups = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + groups
    in_group = groups < GROUP
    q = tl.load(q_ptr + seq * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                mask=in_group[:, None], other=0.0)

    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    start = begin
    while start < end:  # a while loop: Triton's interpreter (the CPU tests) takes no
        positions = start + tl.arange(0, TILE_N)  # run-time bounds in range()
        valid = positions < end
        blocks = tl.load(tables_ptr + seq * stride_table + positions // BLOCK_SIZE,
                         mask=valid, other=0).to(tl.int64)
        slots = positions % BLOCK_SIZE
        k = tl.load(k_ptr + (blocks * stride_kb + slots * stride_ks + kv_head * stride_kh)[:, None]
                    + dims[None, :], mask=valid[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k)) * scale
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])
        total = total * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + (blocks * stride_vb + slots * stride_vs + kv_head * stride_vh)[:, None]
                    + dims[None, :], mask=valid[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
        start += TILE_N

    row = (seq * tl.num_programs(1) * GROUP + heads) * num_splits + split
    tl.store(m_ptr + row, m, mask=in_group)
    tl.store(l_ptr + row, total, mask=in_group)
    tl.store(acc_ptr + row[:, None] * HEAD_DIM + dims[None, :], acc, mask=in_group[:, None])


@triton.jit
def _merge_kernel(m_ptr, l_ptr, acc_ptr, lens_ptr, out_ptr, num_splits, stride_ot, stride_oh,
                  HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    used = tl.cdiv(tl.load(lens_ptr + seq), SPLIT)  # splits holding at least one token
    dims = tl.arange(0, HEAD_DIM)
    base = (seq * tl.num_programs(1) + head) * num_splits
    one = tl.arange(0, 1)
    m = tl.full([1], float("-inf"), tl.float32)
    total = tl.zeros([1], tl.float32)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    s = 0
    while s < used:
        m_s = tl.load(m_ptr + base + s + one)
        m_new = tl.maximum(m, m_s)
        old, new = tl.exp(m - m_new), tl.exp(m_s - m_new)
        total = total * old + tl.load(l_ptr + base + s + one) * new
        acc = acc * old + tl.load(acc_ptr + (base + s) * HEAD_DIM + dims) * new
        m = m_new
        s += 1
    total = tl.where(total == 0.0, 1.0, total)  # an empty context: zeros, not 0/0
    tl.store(out_ptr + seq * stride_ot + head * stride_oh + dims,
             (acc / total).to(out_ptr.dtype.element_ty))


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           max_context: int, scale: float | None = None) -> torch.Tensor:
    """q: [seqs, heads, head_dim], one query per sequence; caches: [blocks, block_size,
    kv_heads, head_dim]; block_tables: int32 [seqs, >= cdiv(context, block_size)];
    context_lens: int32 [seqs], each at most `max_context`. Returns [seqs, heads, head_dim].
    """
    seqs, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    group = heads // kv_heads
    split = split_tokens(seqs, kv_heads)
    num_splits = max(1, triton.cdiv(max_context, split))
    m = torch.empty((seqs, heads, num_splits), dtype=torch.float32, device=q.device)
    total = torch.empty_like(m)
    acc = torch.empty((seqs, heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
    scale = head_dim ** -0.5 if scale is None else scale
    _partial_kernel[(seqs, kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, m, total, acc, scale, num_splits,
        q.stride(0), q.stride(1), block_tables.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, SPLIT=split, TILE_N=TILE)
    out = torch.empty_like(q)
    _merge_kernel[(seqs, heads)](m, total, acc, context_lens, out, num_splits,
                                 out.stride(0), out.stride(1), HEAD_DIM=head_dim, SPLIT=split)
    return out

"""Decode attention straight from the paged KV cache: a split-KV Triton kernel (CUDA).

One query token per sequence attends to its whole cached context, read in place from
the scattered blocks (no gather copy). Each sequence's context is cut into `num_splits`
equal splits (flash-decoding): program (sequence, KV head, split) computes the
softmax-weighted sum of its split for all the query heads that share that KV head (GQA:
K/V are read once per group), keeping the running max and sum; a second kernel merges the
splits. The number of splits depends only on the batch (enough programs to fill the GPU:
many for one sequence, one for a large batch) and each split's length is worked out on the
GPU from the sequence's context length, so the launch is the same for any context: a CUDA
graph captures it once per batch size, whatever the model's context limit, and no program
is spent on positions past a sequence's end. A sequence of context length 0 (a graph's
padding row) gets zeros, not NaN.

flash-attn's paged kernel would do the same, but needs block sizes that are multiples of
256 and has no wheel for every CUDA; Triton ships with PyTorch's CUDA builds.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class DecodeTuning:
    """The partial kernel's launch choices; bench.studies.gpu_check's `kernels` phase
    sweeps them on the GPU at hand (docs/gpu.md)."""
    tile: int = 64      # tokens one program reads per loop iteration
    stages: int = 3     # the loop's pipeline depth: tiles of K/V in flight
    warps: int = 4      # warps per program
    #: programs wanted per launch (4 per SM of an H100): a sequence's splits grow until
    #: the batch's (sequence, KV head, split) programs reach this
    programs: int = 528


#: What every call uses unless it passes its own (read at call time).
TUNING = DecodeTuning()

#: Most splits of one sequence (a batch of one over a long context).
MAX_SPLITS = 64


def num_splits(num_seqs: int, num_kv_heads: int, tuning: DecodeTuning | None = None) -> int:
    """Splits per sequence: enough (sequence, KV head, split) programs to fill the GPU."""
    wanted = (tuning or TUNING).programs
    return max(1, min(MAX_SPLITS, -(-wanted // max(1, num_seqs * num_kv_heads))))


@triton.jit
def _split_length(context, num_splits, TILE_N: tl.constexpr):
    """Tokens per split of a `context`-token sequence: whole tiles, at least one."""
    return tl.maximum(tl.cdiv(tl.cdiv(context, num_splits), TILE_N), 1) * TILE_N


@triton.jit
def _partial_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, m_ptr, l_ptr, acc_ptr,
                    scale, num_splits,
                    stride_qt, stride_qh, stride_table,
                    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr,
                    NUM_STAGES: tl.constexpr):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context = tl.load(lens_ptr + seq)
    length = _split_length(context, num_splits, TILE_N)
    begin = split * length
    end = tl.minimum(begin + length, context)

    groups = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + groups
    in_group = groups < GROUP
    q = tl.load(q_ptr + seq * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                mask=in_group[:, None], other=0.0)

    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    for start in tl.range(begin, end, TILE_N, num_stages=NUM_STAGES):  # loads run ahead
        positions = start + tl.arange(0, TILE_N)
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

    row = (seq * tl.num_programs(1) * GROUP + heads) * num_splits + split
    tl.store(m_ptr + row, m, mask=in_group)
    tl.store(l_ptr + row, total, mask=in_group)
    tl.store(acc_ptr + row[:, None] * HEAD_DIM + dims[None, :], acc, mask=in_group[:, None])


@triton.jit
def _merge_kernel(m_ptr, l_ptr, acc_ptr, lens_ptr, out_ptr, num_splits, stride_ot, stride_oh,
                  HEAD_DIM: tl.constexpr, TILE_N: tl.constexpr):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    context = tl.load(lens_ptr + seq)
    used = tl.cdiv(context, _split_length(context, num_splits, TILE_N))  # splits with tokens
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
                           scale: float | None = None,
                           tuning: DecodeTuning | None = None) -> torch.Tensor:
    """q: [seqs, heads, head_dim], one query per sequence; caches: [blocks, block_size,
    kv_heads, head_dim]; block_tables: int32 [seqs, >= cdiv(context, block_size)];
    context_lens: int32 [seqs]. Returns [seqs, heads, head_dim]. `tuning`: the kernel's
    launch choices (default: `TUNING`).
    """
    tuning = tuning or TUNING
    seqs, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    group = heads // kv_heads
    splits = num_splits(seqs, kv_heads, tuning)
    m = torch.empty((seqs, heads, splits), dtype=torch.float32, device=q.device)
    total = torch.empty_like(m)
    acc = torch.empty((seqs, heads, splits, head_dim), dtype=torch.float32, device=q.device)
    scale = head_dim ** -0.5 if scale is None else scale
    _partial_kernel[(seqs, kv_heads, splits)](
        q, k_cache, v_cache, block_tables, context_lens, m, total, acc, scale, splits,
        q.stride(0), q.stride(1), block_tables.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, TILE_N=tuning.tile, NUM_STAGES=tuning.stages,
        num_warps=tuning.warps)
    out = torch.empty_like(q)
    _merge_kernel[(seqs, heads)](m, total, acc, context_lens, out, splits,
                                 out.stride(0), out.stride(1), HEAD_DIM=head_dim,
                                 TILE_N=tuning.tile)
    return out

"""Attention over a paged KV cache, for a flattened mixed batch.

Layout of one step (built by the executor): the new tokens of every sequence concatenated,
**one-token sequences (decodes) first**, then the multi-token prefill chunks. Each sequence
is `SeqSpec(start, num_tokens, block_table)`: its new tokens sit at positions
start .. start+num_tokens-1 and attend to every position up to their own.

The KV cache of one layer is two tensors `[num_blocks, block_size, num_kv_heads, head_dim]`
(flash-attn's paged layout); position p of a sequence lives in block `block_table[p //
block_size]`, slot `p % block_size`. Each backend writes the step's new K/V there first,
then attends over the cached context.

Two backends share one interface: `build(seqs) -> metadata` once per step (all
index tensors, masks and offsets, so the per-layer work is only tensor ops), and
`backend(q, k, v, k_cache, v_cache, metadata) -> [tokens, heads*head_dim]` per layer.
"""
from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)


class SeqSpec(NamedTuple):
    start: int              # tokens of this sequence already in the cache
    num_tokens: int         # new tokens in this step
    block_table: list[int]  # KV blocks of the sequence, in position order


def _slot_mapping(seqs: list[SeqSpec], block_size: int) -> list[int]:
    slots: list[int] = []
    for start, n, table in seqs:
        for p in range(start, start + n):
            slots.append(table[p // block_size] * block_size + p % block_size)
    return slots


def _padded_tables(seqs: list[SeqSpec], num_blocks: int) -> torch.Tensor:
    width = max(1, num_blocks)
    return torch.tensor([list(s.block_table[:width]) + [0] * (width - min(width, len(s.block_table)))
                         for s in seqs], dtype=torch.long)


def _context_slots(seqs: list[SeqSpec], block_size: int, length: int) -> torch.Tensor:
    """[len(seqs), length] flat cache slots of positions 0..length-1 of each sequence
    (past a sequence's end the slots are junk but valid, and masked out by the caller)."""
    tables = _padded_tables(seqs, -(-length // block_size))
    offsets = torch.arange(block_size)
    return (tables[:, :, None] * block_size + offsets).flatten(1)[:, :length]


@dataclass
class PrefillSpan:
    q_start: int                    # rows of this chunk in the flattened batch
    q_end: int
    gather: torch.Tensor | None     # [context] flat slots; None when the chunk starts at 0
    mask: torch.Tensor | None       # [n, context] True where query may see key


@dataclass
class SdpaMetadata:
    slot_mapping: torch.Tensor      # [tokens] where each new token's K/V goes
    num_single: int                 # leading one-token sequences
    single_gather: torch.Tensor | None  # [num_single, max_context] flat slots
    single_mask: torch.Tensor | None    # [num_single, 1, 1, max_context]
    prefills: list[PrefillSpan]


def _gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Rows of the flattened cache: [*slots.shape, kv_heads, head_dim]."""
    flat = cache.view(-1, *cache.shape[2:])
    return flat.index_select(0, slots.reshape(-1)).view(*slots.shape, *cache.shape[2:])


def _write_cache(k, v, k_cache, v_cache, slot_mapping):
    k_cache.view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v)


class SdpaAttention:
    """`scaled_dot_product_attention` (CPU, or CUDA without flash-attn).

    All one-token sequences go in one padded call: their query heads are folded into
    [kv_heads, group] so GQA needs no copy of K/V, and a key-padding mask hides the pad.
    Each prefill chunk is one call with a causal mask shifted by its start."""

    name = "sdpa"

    def __init__(self, block_size: int, device: torch.device) -> None:
        self.block_size = block_size
        self.device = device

    def build(self, seqs: list[SeqSpec]) -> SdpaMetadata:
        to = dict(device=self.device, non_blocking=True)
        slots = torch.tensor(_slot_mapping(seqs, self.block_size), dtype=torch.long)
        num_single = 0
        while num_single < len(seqs) and seqs[num_single].num_tokens == 1:
            num_single += 1
        gather = mask = None
        if num_single:
            singles = seqs[:num_single]
            lengths = torch.tensor([s.start + 1 for s in singles])
            longest = int(lengths.max())
            gather = _context_slots(singles, self.block_size, longest).to(**to)
            mask = (torch.arange(longest)[None, :] < lengths[:, None])[:, None, None, :].to(**to)
        return SdpaMetadata(slots.to(**to), num_single, gather, mask,
                            self._prefill_spans(seqs[num_single:], num_single, **to))

    def _prefill_spans(self, seqs, row, **to) -> list[PrefillSpan]:
        spans = []
        for seq in seqs:
            gather = mask = None
            if seq.start:
                context = seq.start + seq.num_tokens
                gather = _context_slots([seq], self.block_size, context)[0].to(**to)
                query_pos = torch.arange(seq.start, context)
                mask = (torch.arange(context)[None, :] <= query_pos[:, None]).to(**to)
            spans.append(PrefillSpan(row, row + seq.num_tokens, gather, mask))
            row += seq.num_tokens
        return spans

    def __call__(self, q, k, v, k_cache, v_cache, meta: SdpaMetadata) -> torch.Tensor:
        """q: [tokens, heads, dim]; k, v: [tokens, kv_heads, dim]."""
        _write_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        outs = []
        if meta.num_single:
            outs.append(self._singles(q[:meta.num_single], k_cache, v_cache, meta))
        for span in meta.prefills:
            outs.append(self._prefill(q, k, v, k_cache, v_cache, span))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    @staticmethod
    def _singles(q, k_cache, v_cache, meta: SdpaMetadata) -> torch.Tensor:
        n, heads, dim = q.shape
        kv_heads = k_cache.shape[2]
        keys = _gather(k_cache, meta.single_gather).transpose(1, 2)
        values = _gather(v_cache, meta.single_gather).transpose(1, 2)
        out = F.scaled_dot_product_attention(q.view(n, kv_heads, heads // kv_heads, dim),
                                             keys, values, attn_mask=meta.single_mask)
        return out.reshape(n, heads * dim)

    @staticmethod
    def _prefill(q, k, v, k_cache, v_cache, span: PrefillSpan) -> torch.Tensor:
        query = q[span.q_start:span.q_end]
        n, heads, dim = query.shape
        if span.gather is None:  # the whole context is this chunk: plain causal attention
            keys, values = k[span.q_start:span.q_end], v[span.q_start:span.q_end]
        else:
            keys, values = _gather(k_cache, span.gather), _gather(v_cache, span.gather)
        out = F.scaled_dot_product_attention(
            query.transpose(0, 1)[None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
            attn_mask=span.mask, is_causal=span.mask is None, enable_gqa=True)
        return out[0].transpose(0, 1).reshape(n, heads * dim)


@dataclass
class FlashMetadata:
    slot_mapping: torch.Tensor
    cu_seqlens_q: torch.Tensor      # int32 [seqs + 1]
    cu_seqlens_k: torch.Tensor      # int32 [seqs + 1]
    max_seqlen_q: int
    max_seqlen_k: int
    block_table: torch.Tensor | None  # int32 [seqs, max_blocks] (paged kernel)
    gather: torch.Tensor | None       # [sum of contexts] flat slots (contiguous kernel)


class FlashAttention:
    """flash-attn 2 varlen kernel (CUDA, fp16/bf16). Untested here: no GPU on the dev box.

    flash-attn 2 reads a paged cache directly only when the block size is a multiple of
    256; for smaller blocks we gather each sequence's K/V into one packed tensor and call
    the same kernel without `block_table`. `causal=True` aligns the mask to the bottom
    right, which is exactly "query at start+i sees keys 0..start+i"."""

    name = "flash-attn"

    def __init__(self, block_size: int, device: torch.device, paged: bool) -> None:
        from flash_attn import flash_attn_varlen_func
        self._kernel = flash_attn_varlen_func
        self.block_size = block_size
        self.device = device
        self.paged = paged

    def build(self, seqs: list[SeqSpec]) -> FlashMetadata:
        to = dict(device=self.device, non_blocking=True)
        q_lens = [s.num_tokens for s in seqs]
        k_lens = [s.start + s.num_tokens for s in seqs]
        cu_q = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        cu_k = torch.tensor([0] + k_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        table = gather = None
        if self.paged:
            width = max(-(-n // self.block_size) for n in k_lens)
            table = _padded_tables(seqs, width).to(dtype=torch.int32, **to)
        else:
            longest = max(k_lens)
            valid = torch.arange(longest)[None, :] < torch.tensor(k_lens)[:, None]
            gather = _context_slots(seqs, self.block_size, longest)[valid].to(**to)
        slots = torch.tensor(_slot_mapping(seqs, self.block_size), dtype=torch.long)
        return FlashMetadata(slots.to(**to), cu_q.to(**to), cu_k.to(**to), max(q_lens),
                             max(k_lens), table, gather)

    def __call__(self, q, k, v, k_cache, v_cache, meta: FlashMetadata) -> torch.Tensor:
        _write_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        extra = {}
        if meta.block_table is not None:
            keys, values, extra["block_table"] = k_cache, v_cache, meta.block_table
        else:
            keys, values = _gather(k_cache, meta.gather), _gather(v_cache, meta.gather)
        out = self._kernel(q, keys, values, meta.cu_seqlens_q, meta.cu_seqlens_k,
                           meta.max_seqlen_q, meta.max_seqlen_k, causal=True, **extra)
        return out.reshape(q.shape[0], -1)


def select_attention(device: torch.device, dtype: torch.dtype, block_size: int):
    """flash-attn on CUDA with fp16/bf16 when it imports; SDPA otherwise (says why)."""
    if device.type != "cuda":
        return SdpaAttention(block_size, device)
    if dtype not in (torch.float16, torch.bfloat16):
        log.info("attention: SDPA (flash-attn needs fp16/bf16, model runs in %s)", dtype)
        return SdpaAttention(block_size, device)
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError as exc:
        log.warning("attention: SDPA (flash-attn not importable: %s)", exc)
        return SdpaAttention(block_size, device)
    has_paged = "block_table" in inspect.signature(flash_attn_varlen_func).parameters
    paged = has_paged and block_size % 256 == 0
    if not paged:
        log.info("attention: flash-attn on gathered K/V (paged kernel needs block_size %% 256 == 0"
                 " and flash-attn >= 2.5; block_size is %d)", block_size)
    return FlashAttention(block_size, device, paged)

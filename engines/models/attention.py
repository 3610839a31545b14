"""Attention over a paged KV cache, for a flattened mixed batch: the backends' interface.

Layout of one step (built by the executor): the new tokens of every sequence concatenated,
**one-token sequences (decodes) first**, longest context first among them, then the
multi-token prefill chunks. Each sequence is `SeqSpec(start, num_tokens, block_table)`:
its new tokens sit at positions start .. start+num_tokens-1 and attend to every position
up to their own. The cache layout is engines/models/paged_kv.py's. Each backend writes
the step's new K/V there first, then attends over the cached context.

Three backends share one interface: `build(seqs) -> metadata` once per step (all
index tensors, masks and offsets, so the per-layer work is only tensor ops), and
`backend(q, k, v, k_cache, v_cache, metadata) -> [tokens, heads*head_dim]` per layer:
`SdpaAttention` (engines/models/sdpa_attention.py; CPU), `TritonAttention`
(engines/models/triton_attention.py; CUDA) and `FlashAttention` below (CUDA without Triton).
"""
from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass

import torch

from engines.models.paged_kv import SeqSpec
from engines.models.paged_kv import context_slots as _context_slots
from engines.models.paged_kv import gather as _gather
from engines.models.paged_kv import padded_tables as _padded_tables
from engines.models.paged_kv import slot_mapping as _slot_mapping
from engines.models.paged_kv import write_cache as _write_cache
from engines.models.sdpa_attention import SdpaAttention

__all__ = ["FlashAttention", "SdpaAttention", "SeqSpec", "select_attention"]

log = logging.getLogger(__name__)


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
    """On CUDA with fp16/bf16: the Triton paged backend (decodes read the cache in place,
    and the executor can capture them in CUDA graphs) when Triton imports, else flash-attn
    when it imports; SDPA otherwise (says why)."""
    if device.type != "cuda":
        return SdpaAttention(block_size, device, dtype)
    if dtype not in (torch.float16, torch.bfloat16):
        log.info("attention: SDPA (the CUDA kernels need fp16/bf16, model runs in %s)", dtype)
        return SdpaAttention(block_size, device, dtype)
    try:
        from engines.models.triton_attention import TritonAttention
        return TritonAttention(block_size, device, dtype)
    except ImportError as exc:
        log.warning("attention: Triton not importable (%s); trying flash-attn", exc)
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError as exc:
        log.warning("attention: SDPA (flash-attn not importable: %s)", exc)
        return SdpaAttention(block_size, device, dtype)
    has_paged = "block_table" in inspect.signature(flash_attn_varlen_func).parameters
    paged = has_paged and block_size % 256 == 0
    if not paged:
        log.info("attention: flash-attn on gathered K/V (paged kernel needs block_size %% 256 == 0"
                 " and flash-attn >= 2.5; block_size is %d)", block_size)
    return FlashAttention(block_size, device, paged)

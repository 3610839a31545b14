"""The CUDA attention backend: decodes read the paged cache in place through the Triton
kernel of engines/models/paged_decode.py; prefill chunks go to SDPA (whose CUDA build
runs FlashAttention-2 for the plain causal case), as engines/models/sdpa_attention.py
lays them out.

Its decode metadata is plain tensors of fixed meaning (slots, block tables, context
lengths), so engines/executors/decode_graphs.py can capture the decode step in a CUDA
graph over static copies of them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engines.models.paged_decode import paged_decode_attention
from engines.models.paged_kv import SeqSpec, write_cache
from engines.models.sdpa_attention import SdpaAttention, SdpaMetadata


@dataclass
class PagedDecodeMetadata:
    slot_mapping: torch.Tensor      # int64 [decodes]: where each decode's new K/V goes
    block_tables: torch.Tensor      # int32 [decodes, width]
    context_lens: torch.Tensor      # int32 [decodes], 0 for a padding row


@dataclass
class TritonMetadata:
    num_decodes: int                # the batch's first rows, one token each
    decodes: PagedDecodeMetadata | None
    prefills: SdpaMetadata | None   # the multi-token chunks after them


def decode_arrays(seqs: list[SeqSpec], block_size: int, width: int | None = None):
    """(slots, block tables, context lengths) of one-token sequences as numpy arrays;
    tables padded with block 0 to `width` columns (default: the longest needed)."""
    lens = np.fromiter((s.start + 1 for s in seqs), dtype=np.int32, count=len(seqs))
    needed = -(-int(lens.max()) // block_size) if len(seqs) else 1
    tables = np.zeros((len(seqs), width or needed), dtype=np.int32)
    slots = np.empty(len(seqs), dtype=np.int64)
    for row, (start, _, table) in enumerate(seqs):
        used = -(-(start + 1) // block_size)
        tables[row, :used] = table[:used]
        slots[row] = table[start // block_size] * block_size + start % block_size
    return slots, tables, lens


class TritonAttention:
    name = "triton-paged"

    def __init__(self, block_size: int, device: torch.device, dtype: torch.dtype) -> None:
        self.block_size = block_size
        self.device = device
        self.prefill = SdpaAttention(block_size, device, dtype)

    def build(self, seqs: list[SeqSpec]) -> TritonMetadata:
        num_decodes = 0
        while num_decodes < len(seqs) and seqs[num_decodes].num_tokens == 1:
            num_decodes += 1
        decodes = prefills = None
        if num_decodes:
            slots, tables, lens = decode_arrays(seqs[:num_decodes], self.block_size)
            to = {"device": self.device, "non_blocking": True}
            decodes = PagedDecodeMetadata(
                torch.from_numpy(slots).to(**to), torch.from_numpy(tables).to(**to),
                torch.from_numpy(lens).to(**to))
        if num_decodes < len(seqs):
            prefills = self.prefill.build(seqs[num_decodes:])
        return TritonMetadata(num_decodes, decodes, prefills)

    def decode(self, q, k, v, k_cache, v_cache, meta: PagedDecodeMetadata) -> torch.Tensor:
        """One-token rows only: [rows, heads, dim] -> [rows, heads * dim]."""
        write_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        out = paged_decode_attention(q, k_cache, v_cache, meta.block_tables,
                                     meta.context_lens)
        return out.reshape(q.shape[0], -1)

    def __call__(self, q, k, v, k_cache, v_cache, meta: TritonMetadata) -> torch.Tensor:
        d = meta.num_decodes
        outs = []
        if meta.decodes is not None:
            outs.append(self.decode(q[:d], k[:d], v[:d], k_cache, v_cache, meta.decodes))
        if meta.prefills is not None:
            outs.append(self.prefill(q[d:], k[d:], v[d:], k_cache, v_cache, meta.prefills))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

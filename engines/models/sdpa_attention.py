"""Attention with `scaled_dot_product_attention` over the paged KV cache (CPU, or CUDA
without flash-attn), for a flattened mixed batch (layout: engines/models/attention.py).

`build` turns the step into index tensors once; per layer the backend writes the new K/V,
then reads, with one `index_select` per cache, every block the step attends to: whole
blocks (one block of K is one contiguous row, so the copy is a few large memcpys, not one
per position), and only each sequence's own blocks -- the decodes are not padded to the
longest context in the batch.

Decodes (one-token sequences: first in the batch, longest first) are cut by
`length_groups` into a few runs of similar length, each one batched SDPA call: padded to
the run's longest, with a key-padding mask when its lengths differ. Query heads are folded
into [kv_heads, group] so GQA needs no copy of K/V. A prefill chunk that continues its
sequence is one call over its gathered context with a causal mask shifted by its start;
chunks that start their sequence attend causally to their own fresh k, v, adjacent ones of
one length in a single batched call.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engines.models.paged_kv import SeqSpec, slot_mapping, write_cache

# An extra SDPA call per layer (its slicing, the call, its share of the final cat) costs
# about what attending over ~500 more (sequence, position) pairs does -- CPU, tiny model:
# ~25 us per call against ~16 pairs per us for the copy plus the attention. A run of
# decodes is cut where the padding saved is worth more than that...
GROUP_COST_POSITIONS = 512
# ...and only where the next length is at most 3/4 of the run's longest, so lengths that
# fall off gradually make a few runs, not one call per sequence.
GROUP_MAX_RATIO = 0.75


def length_groups(lengths: list[int], block_size: int) -> list[tuple[int, int]]:
    """Cut decode context lengths (longest first) into runs [begin, end) attended together.

    Any order is correct (a run pads to its longest); longest first keeps the padding small."""
    groups, begin = [], 0
    longest = -(-lengths[0] // block_size) * block_size
    for i in range(1, len(lengths)):
        padded = -(-lengths[i] // block_size) * block_size
        saved = (longest - padded) * (len(lengths) - i)
        if padded <= GROUP_MAX_RATIO * longest and saved > GROUP_COST_POSITIONS:
            groups.append((begin, i))
            begin, longest = i, padded
        else:
            longest = max(longest, padded)
    groups.append((begin, len(lengths)))
    return groups


def _additive(hidden: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A float mask: 0 where a key is seen, -inf where `hidden`. SDPA would turn a boolean
    mask into this on every call, i.e. once per layer; built once per step instead."""
    return torch.zeros(hidden.shape, dtype=dtype).masked_fill_(hidden, float("-inf"))


@dataclass
class DecodeGroup:
    row_start: int                  # its sequences (= query rows) in the batch
    row_end: int
    block_start: int                # its blocks in the step's gathered blocks,
    block_end: int                  # (row_end - row_start) x blocks per sequence
    length: int                     # keys per sequence: the run's longest context
    mask: torch.Tensor | None       # [rows, 1, 1, length] -inf on padding; None: no padding


@dataclass
class PrefillSpan:
    q_start: int                    # rows of these chunks in the flattened batch
    q_end: int
    num_seqs: int                   # >1 only for fresh chunks of one length, batched in one call
    block_start: int                # its blocks in the step's gathered blocks
    block_end: int                  # (both 0 when the chunk starts at 0: nothing to read)
    context: int                    # keys per sequence: cached positions + its chunk
    mask: torch.Tensor | None       # [n, context] -inf where query may not see key; None: causal


@dataclass
class SdpaMetadata:
    slot_mapping: torch.Tensor      # [tokens] where each new token's K/V goes
    blocks: torch.Tensor | None     # every block the step reads: decode runs, then prefills
    decodes: list[DecodeGroup]
    prefills: list[PrefillSpan]


class SdpaAttention:
    name = "sdpa"

    def __init__(self, block_size: int, device: torch.device,
                 dtype: torch.dtype = torch.float32) -> None:
        self.block_size = block_size
        self.device = device
        self.dtype = dtype  # the model's: SDPA wants float masks in the query's dtype

    def build(self, seqs: list[SeqSpec]) -> SdpaMetadata:
        to = {"device": self.device, "non_blocking": True}
        num_single = 0
        while num_single < len(seqs) and seqs[num_single].num_tokens == 1:
            num_single += 1
        block_ids: list[int] = []
        decodes = self._decode_groups(seqs[:num_single], block_ids, to)
        prefills = self._prefill_spans(seqs[num_single:], num_single, block_ids, to)
        slots = torch.tensor(slot_mapping(seqs, self.block_size), dtype=torch.long)
        blocks = torch.tensor(block_ids, dtype=torch.long).to(**to) if block_ids else None
        return SdpaMetadata(slots.to(**to), blocks, decodes, prefills)

    def _decode_groups(self, seqs, block_ids: list[int], to) -> list[DecodeGroup]:
        if not seqs:
            return []
        lengths = [s.start + 1 for s in seqs]
        groups = []
        for begin, end in length_groups(lengths, self.block_size):
            run = lengths[begin:end]
            longest = max(run)
            width = -(-longest // self.block_size)
            first = len(block_ids)
            for seq in seqs[begin:end]:
                table = seq.block_table[:width]
                block_ids.extend(table)
                block_ids.extend([0] * (width - len(table)))  # junk but valid, masked out
            mask = None
            if min(run) != longest:
                hidden = torch.arange(longest)[None, :] >= torch.tensor(run)[:, None]
                mask = _additive(hidden, self.dtype)[:, None, None, :].to(**to)
            groups.append(DecodeGroup(begin, end, first, len(block_ids), longest, mask))
        return groups

    def _prefill_spans(self, seqs, row: int, block_ids: list[int], to) -> list[PrefillSpan]:
        spans: list[PrefillSpan] = []
        for seq in seqs:
            n, context = seq.num_tokens, seq.start + seq.num_tokens
            if seq.start:
                first = len(block_ids)
                block_ids.extend(seq.block_table[:-(-context // self.block_size)])
                query_pos = torch.arange(seq.start, context)
                hidden = torch.arange(context)[None, :] > query_pos[:, None]
                mask = _additive(hidden, self.dtype).to(**to)
                spans.append(PrefillSpan(row, row + n, 1, first, len(block_ids), context, mask))
            elif spans and spans[-1].mask is None and spans[-1].context == n:
                spans[-1].q_end += n  # one more fresh chunk of the same length: same call
                spans[-1].num_seqs += 1
            else:
                spans.append(PrefillSpan(row, row + n, 1, 0, 0, n, None))
            row += n
        return spans

    def __call__(self, q, k, v, k_cache, v_cache, meta: SdpaMetadata) -> torch.Tensor:
        """q: [tokens, heads, dim]; k, v: [tokens, kv_heads, dim] -> [tokens, heads*dim]."""
        write_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        keys = values = None
        if meta.blocks is not None:
            keys = k_cache.index_select(0, meta.blocks)
            values = v_cache.index_select(0, meta.blocks)
        outs = [self._decodes(q, keys, values, group) for group in meta.decodes]
        outs += [self._prefill(q, k, v, keys, values, span) for span in meta.prefills]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    @staticmethod
    def _decodes(q, keys, values, group: DecodeGroup) -> torch.Tensor:
        n = group.row_end - group.row_start
        _, heads, dim = q.shape
        kv_heads = keys.shape[2]

        def context(blocks):  # [n, kv_heads, length, dim], a view of the gathered blocks
            rows = blocks[group.block_start:group.block_end].view(n, -1, kv_heads, dim)
            return rows[:, :group.length].transpose(1, 2)

        query = q[group.row_start:group.row_end].view(n, kv_heads, heads // kv_heads, dim)
        out = F.scaled_dot_product_attention(query, context(keys), context(values),
                                             attn_mask=group.mask)
        return out.reshape(n, heads * dim)

    @staticmethod
    def _prefill(q, k, v, keys, values, span: PrefillSpan) -> torch.Tensor:
        rows = slice(span.q_start, span.q_end)
        if span.mask is None:  # the whole context is each chunk: plain causal attention
            keys, values = k[rows], v[rows]
        else:
            kv_shape = (-1, *keys.shape[2:])
            keys = keys[span.block_start:span.block_end].view(kv_shape)[:span.context]
            values = values[span.block_start:span.block_end].view(kv_shape)[:span.context]

        def heads_first(x):  # [seqs * n, heads, dim] -> [seqs, heads, n, dim]
            return x.unflatten(0, (span.num_seqs, -1)).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            heads_first(q[rows]), heads_first(keys), heads_first(values),
            attn_mask=span.mask, is_causal=span.mask is None, enable_gqa=True)
        return out.transpose(1, 2).reshape(span.q_end - span.q_start, -1)

"""Bytes moved (M) and FLOPs (F) of one forward pass, from the batch's composition.

After the Ascendra paper, Appendix A.2-A.4, per decoder layer, with two corrections:
GQA (K/V have `kv_heads`, not `heads`: the paper's KV figures are 4x too big for
Llama-3-8B) and real units (FLOPs count 2 per multiply-add and M counts bytes, so
t_M = M / bandwidth and t_F = F / peak are true roofline times). With T tokens in
the batch, q = heads*head_dim, kv = kv_heads*head_dim, e bytes per element:

GEMMs (q/k/v/o and gate/up/down; weights read once per batch):
    F = 2 T W,   M = e (W + T (5h + 2q + 2kv + 3m)),   W = h(2q + 2kv) + 3hm
Attention of a prefill chunk of c tokens after l cached ones (A.2/A.4; the chunk's own
causal part included, so l = 0 is the unchunked prefill):
    F = 4q (c l + c(c+1)/2)
    M = e (2 q c + 2 kv K),   K = r l + b r(r-1)/2 + c,   r = ceil(c / b)
      Q is read and O written once; K/V are streamed once per tile of b queries, each
      tile reading the keys up to its last query: flash-attention 2's loop order (the
      kernel we run), where the paper counts flash-attention 1's (K/V once, Q/O re-read
      per key tile, which would make a 2k-token prefill move ~8x more bytes than its
      weights). With c = 1 this is exactly the paper's own decode figure:
Attention of a decode with context l̂ (A.3):
    F = 4q l̂,   M = e (2 kv l̂ + 2q)
Whole model: layers x (GEMMs + attention) + embedding rows read + the LM head, which
runs once per sequence (every decode samples; a prefill chunk is counted as if it did).
Elementwise work (norms, RoPE, SiLU) is left out, as in the paper.
"""
from __future__ import annotations

import numpy as np

from engines.perf.hardware_spec import HardwareSpec
from engines.perf.model_shape import ModelShape
from policies.batch_shape import BatchShape

__all__ = ["bytes_and_flops", "prefill_bytes_and_flops", "times"]


def prefill_attention(c, l, model: ModelShape) -> tuple[np.ndarray, np.ndarray]:
    """(elements moved, FLOPs) of attention, per layer, for chunks of c tokens after l."""
    c, l = np.asarray(c, dtype=np.float64), np.asarray(l, dtype=np.float64)
    tiles = np.ceil(c / model.attn_block)
    keys_read = tiles * l + model.attn_block * tiles * (tiles - 1) / 2 + c
    moved = 2 * model.q_size * c + 2 * model.kv_size * keys_read
    flops = 4 * model.q_size * (c * l + c * (c + 1) / 2)
    return moved, flops


def decode_attention(ctx, model: ModelShape) -> tuple[np.ndarray, np.ndarray]:
    """(elements moved, FLOPs) of attention, per layer, for decodes attending to ctx tokens."""
    ctx = np.asarray(ctx, dtype=np.float64)
    return 2 * model.kv_size * ctx + 2 * model.q_size, 4 * model.q_size * ctx


def _whole_model(tokens, seqs, attn_moved, attn_flops, model: ModelShape):
    """(M bytes, F) of the model for batches of `tokens` tokens in `seqs` sequences whose
    per-layer attention costs are given; broadcasts over arrays."""
    tokens = np.asarray(tokens, dtype=np.float64)
    seqs = np.asarray(seqs, dtype=np.float64)
    h, m, w = model.hidden, model.intermediate, model.layer_weights
    any_work = tokens > 0
    gemm_moved = w * any_work + tokens * (5 * h + 2 * model.q_size + 2 * model.kv_size + 3 * m)
    head_moved = model.vocab * h * any_work + tokens * h + seqs * (h + model.vocab)
    moved = model.layers * (gemm_moved + attn_moved) + head_moved
    flops = model.layers * (2 * tokens * w + attn_flops) + 2 * seqs * model.vocab * h
    return moved * model.bytes_per_element, flops


def bytes_and_flops(shape: BatchShape, model: ModelShape) -> tuple[float, float]:
    """(M, F) of running `shape` through the whole model. The same sums as the array
    functions above, in plain floats: a step asks this for one batch of a few chunks and
    many decodes, where numpy's per-call cost is most of the time (decode attention is
    linear in the context, so the decodes need only the sum of theirs)."""
    q, kv, block = model.q_size, model.kv_size, model.attn_block
    moved = flops = 0.0
    for c, l in shape.prefills:
        tiles = -(-c // block)
        moved += 2 * q * c + 2 * kv * (tiles * l + block * tiles * (tiles - 1) / 2 + c)
        flops += 4 * q * (c * l + c * (c + 1) / 2)
    decodes = len(shape.decodes)
    if decodes:
        context = float(shape.decode_context_sum)
        moved += 2 * kv * context + 2 * q * decodes
        flops += 4 * q * context
    tokens, seqs = float(shape.num_tokens), float(shape.num_seqs)
    h, m, w = model.hidden, model.intermediate, model.layer_weights
    any_work = 1.0 if tokens > 0 else 0.0
    gemm_moved = w * any_work + tokens * (5 * h + 2 * q + 2 * kv + 3 * m)
    head_moved = model.vocab * h * any_work + tokens * h + seqs * (h + model.vocab)
    total_moved = model.layers * (gemm_moved + moved) + head_moved
    total_flops = model.layers * (2 * tokens * w + flops) + 2 * seqs * model.vocab * h
    return total_moved * model.bytes_per_element, total_flops


def prefill_bytes_and_flops(num_tokens, already, model: ModelShape):
    """(M, F) arrays: element i is a batch holding only a chunk of num_tokens[i] tokens
    after already[i] cached ones. Vectorised for scoring many waiting requests at once."""
    c = np.asarray(num_tokens, dtype=np.float64)
    moved, flops = prefill_attention(c, already, model)
    moved, flops = moved * (c > 0), flops * (c > 0)  # no chunk: no attention either
    return _whole_model(c, (c > 0).astype(np.float64), moved, flops, model)


def times(shape: BatchShape, model: ModelShape, hw: HardwareSpec) -> tuple[float, float]:
    """(t_M, t_F): seconds to move M bytes at peak bandwidth and to do F FLOPs at peak."""
    moved, flops = bytes_and_flops(shape, model)
    return moved / hw.bandwidth, flops / hw.peak_flops

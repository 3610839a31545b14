"""Attention time of one layer, from the batch's FLOPs and bytes (engines.perf.features)
and efficiencies calibrated on Vidur's A100 Llama-3-8B FlashInfer profile.

Vidur's `attention.csv` is not among the raw profiles the tables derive from (tables/README.md),
so attention is a roofline with fitted efficiencies rather than a table look-up:

* decode (one kernel for all decodes of the batch; memory bound):
      t = DECODE_LAUNCH + max(M / (bandwidth * DECODE_BW_FRACTION), F / peak)
  M, F: the K/V bytes read and FLOPs of perf_features.decode_attention.
* prefill (one kernel for all chunks; compute bound):
      t = PREFILL_LAUNCH + sum_i max(F_i / (peak * e(c_i)), M_i / (bandwidth * DECODE_BW_FRACTION))
      F_i = 4 q (c_i l_i + CAUSAL_WEIGHT * c_i (c_i + 1) / 2)
      e(c) = PREFILL_PEAK_FRACTION * c heads / (c heads + HALF_ROWS)
  A chunk of c queries keeps c * heads query rows in flight: a 64-token chunk fills a
  fraction of the SMs, so its FLOPs run slower (e rises with c, halfway at HALF_ROWS).
  The causal part (the chunk against itself) runs CAUSAL_WEIGHT times slower per FLOP than
  the part against cached keys: masked diagonal tiles and uneven work per query tile.

Calibration (A100, Llama-3-8B shape, TP=1, FlashInfer medians in ms per layer; least
squares on log ratios, README points weighted 3x, once, by hand -- no fit runs here):
* decode: the README's 8 attn_decode spot values (ctx 1728/1664, batch 1..344) ->
  DECODE_LAUNCH 21 us, DECODE_BW_FRACTION 0.82. Predicted/published: 1.01 1.05 0.94 1.04
  0.81 (batch 48, off the trend of its neighbours) 1.03 1.07 1.10.
* prefill: the README's 64-token chunk range (0.011 ms at kv 0, 0.065 at kv 4672) plus 22
  a sample of that file's prefill rows consulted once (chunks 64..2048 tokens, kv
  0..15840; the file itself is not among the raw profiles and none of it is stored here) ->
  PREFILL_LAUNCH 11 us, PREFILL_PEAK_FRACTION 0.54, HALF_ROWS 60 x 32 heads,
  CAUSAL_WEIGHT 1.6. The README's two points come out at 1.07 and 1.05; the other rows
  within 0.7-1.17 except one kernel-switch step (64 tokens at kv 512: 0.40).
The file's `attn_kv_cache_save` (about 0.5 us per prefill token per layer there, 3 us for
a whole decode batch) is left out: it looks like a slow copy path of that vLLM version,
and the README's spot values do not include it.
H100 and the other models: no attention profile exists, so the same efficiencies are
applied to their shapes and the H100's peak FLOP/s and bandwidth -- an assumption.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies.batch_shape import BatchShape
from engines.perf.hardware_spec import HardwareSpec
from engines.perf.model_shape import ModelShape
from engines.perf.features import decode_attention, prefill_attention


@dataclass(frozen=True)
class AttentionCalibration:
    decode_launch_s: float = 21e-6
    decode_bw_fraction: float = 0.82
    prefill_launch_s: float = 11e-6
    prefill_peak_fraction: float = 0.54
    #: query rows (tokens x heads) at which a chunk reaches half of prefill_peak_fraction
    half_rows: float = 60 * 32
    causal_weight: float = 1.6


FLASHINFER_A100 = AttentionCalibration()


def decode_seconds(context, model: ModelShape, hw: HardwareSpec,
                   cal: AttentionCalibration = FLASHINFER_A100) -> float:
    """One layer's decode attention for decodes attending to `context` tokens each."""
    context = np.asarray(context)
    if context.size == 0:
        return 0.0
    moved, flops = decode_attention(context, model)
    memory = moved.sum() * model.bytes_per_element / (hw.bandwidth * cal.decode_bw_fraction)
    return cal.decode_launch_s + max(float(memory), float(flops.sum()) / hw.peak_flops)


def prefill_seconds(tokens, cached, model: ModelShape, hw: HardwareSpec,
                    cal: AttentionCalibration = FLASHINFER_A100) -> float:
    """One layer's attention for prefill chunks of `tokens` after `cached` tokens each."""
    c = np.asarray(tokens, dtype=np.float64)
    if c.size == 0:
        return 0.0
    l = np.asarray(cached, dtype=np.float64)
    moved, flops = prefill_attention(c, l, model)
    cross = 4.0 * model.q_size * c * l
    weighted = cross + cal.causal_weight * (flops - cross)
    rows = c * model.heads
    efficiency = cal.prefill_peak_fraction * rows / (rows + cal.half_rows)
    compute = weighted / (hw.peak_flops * efficiency)
    memory = moved * model.bytes_per_element / (hw.bandwidth * cal.decode_bw_fraction)
    return cal.prefill_launch_s + float(np.maximum(compute, memory).sum())


def attention_seconds(shape: BatchShape, model: ModelShape, hw: HardwareSpec,
                      cal: AttentionCalibration = FLASHINFER_A100) -> float:
    """One layer's attention for the whole batch: the prefill kernel plus the decode kernel
    (the functions above in plain floats: one batch per step, where numpy's per-call cost
    would be most of the time; decode costs are linear in the summed context)."""
    seconds = 0.0
    bandwidth = hw.bandwidth * cal.decode_bw_fraction
    e, q, kv, block = model.bytes_per_element, model.q_size, model.kv_size, model.attn_block
    if shape.prefills:
        seconds += cal.prefill_launch_s
        for c, l in shape.prefills:
            tiles = -(-c // block)
            moved = 2 * q * c + 2 * kv * (tiles * l + block * tiles * (tiles - 1) / 2 + c)
            flops = 4 * q * (c * l + c * (c + 1) / 2)
            cross = 4.0 * q * c * l
            weighted = cross + cal.causal_weight * (flops - cross)
            rows = c * model.heads
            efficiency = cal.prefill_peak_fraction * rows / (rows + cal.half_rows)
            seconds += max(weighted / (hw.peak_flops * efficiency), moved * e / bandwidth)
    decodes = len(shape.decodes)
    if decodes:
        context = float(shape.decode_context_sum)
        moved = 2 * kv * context + 2 * q * decodes
        seconds += cal.decode_launch_s + max(moved * e / bandwidth,
                                             4 * q * context / hw.peak_flops)
    return seconds

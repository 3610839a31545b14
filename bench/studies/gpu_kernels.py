"""Where a decode step's time goes on one CUDA GPU (`gpu_check`'s `kernels` phase).

* the paged decode kernel alone, one layer at 1k-token contexts, for a grid of launch
  choices (`DecodeTuning`): its KV read rate against the card's copy bandwidth;
* every linear layer of a Llama-3-8B shape at 1, 16 and 64 rows (cuBLAS): its weight read
  rate against the copy bandwidth, and the sum of them over a step (both timed inside CUDA
  graphs, as a step runs them);
* one replayed decode graph under the profiler: GPU time per kind of kernel (matrix
  products, attention, element-wise, KV cache writes) and the gaps between kernels;
* end to end, the step before and after this phase's changes on the same loaded model:
  torch element-wise ops with an unpipelined kernel, then the fused ops with `TUNING`.
"""
from __future__ import annotations

import msgspec
import torch
import torch.nn.functional as F

from bench.studies.gpu_measure import (Ceilings, DecodePoint, measure_decode, time_events,
                                       time_graph)

SWEEP_BATCHES = (1, 16, 64)
SWEEP_CONTEXT = 1024
#: (tile, stages, warps, programs); (32, 1, 4, 264) is close to the kernel before pipelining
SWEEP = [(32, 1, 4, 264), (32, 3, 4, 528), (64, 2, 4, 528), (64, 3, 4, 264), (64, 3, 4, 528),
         (64, 3, 4, 1056), (64, 4, 4, 528), (64, 3, 8, 528), (128, 2, 4, 528), (128, 3, 8, 528),
         (128, 3, 8, 1056)]
LINEAR_ROWS = (1, 16, 64)
PROFILED_BATCHES = (1, 64)


class KernelTiming(msgspec.Struct):
    batch: int
    tile: int
    stages: int
    warps: int
    programs: int
    us: float
    kv_bytes: int
    fraction_of_copy: float       # KV bytes / time / copy bandwidth


class LinearTiming(msgspec.Struct):
    name: str
    rows: int
    us: float
    weight_bytes: int
    fraction_of_copy: float


class StepBreakdown(msgspec.Struct):
    batch: int
    replay_us: float              # the graph between CUDA events
    kernels_per_step: float
    us_by_kind: dict[str, float]  # GPU time per step by kind of kernel
    top_kernels: list[tuple[str, float]]


class Variant(msgspec.Struct):
    name: str
    ops: str
    tuning: tuple[int, int, int, int]   # tile, stages, warps, programs
    decode: list[DecodePoint]
    breakdown: list[StepBreakdown]


class KernelStudy(msgspec.Struct):
    device: str
    decode_kernel: list[KernelTiming]
    linears: list[LinearTiming]
    linear_us_per_step: dict[int, float]   # rows -> all 8B linears of one decode step
    variants: list[Variant]


def sweep_decode_kernel(ceilings: Ceilings) -> list[KernelTiming]:
    """One layer's decode attention (32 query / 8 KV heads, head_dim 128, blocks of 16),
    timed inside a CUDA graph as a decode step runs it."""
    from engines.models.paged_decode import TUNING, DecodeTuning, paged_decode_attention
    timings = []
    for batch in SWEEP_BATCHES:
        torch.manual_seed(batch)
        per_seq = SWEEP_CONTEXT // 16
        k_cache = torch.randn(batch * per_seq, 16, 8, 128, dtype=torch.bfloat16, device="cuda")
        v_cache = torch.randn_like(k_cache)
        tables = torch.randperm(batch * per_seq, device="cuda").int().view(batch, per_seq)
        lens = torch.full((batch,), SWEEP_CONTEXT, dtype=torch.int32, device="cuda")
        q = torch.randn(batch, 32, 128, dtype=torch.bfloat16, device="cuda")
        kv_bytes = 2 * k_cache.numel() * k_cache.element_size()
        for tuning in [DecodeTuning(*t) for t in SWEEP] + [TUNING]:
            try:
                us = 1e3 * time_graph(lambda: paged_decode_attention(
                    q, k_cache, v_cache, tables, lens, tuning=tuning))
            except Exception as exc:  # e.g. a tile that needs more shared memory than there is
                print(f"decode kernel {tuning}: {type(exc).__name__}: {exc}", flush=True)
                continue
            timings.append(KernelTiming(batch, tuning.tile, tuning.stages, tuning.warps,
                                        tuning.programs, us, kv_bytes,
                                        kv_bytes / (us / 1e6) / ceilings.copy_bytes_per_s))
            print(f"decode kernel batch {batch} {tuning}: {us:.1f} us, "
                  f"{timings[-1].fraction_of_copy:.2f} of copy", flush=True)
    return timings


def linear_shapes(config) -> dict[str, tuple[int, int, int]]:
    """name -> (in, out, times per step) of every matrix product of a decode step."""
    c = config
    layers = c.num_hidden_layers
    return {"qkv_proj": (c.hidden_size, c.q_size + 2 * c.kv_size, layers),
            "o_proj": (c.q_size, c.hidden_size, layers),
            "gate_up_proj": (c.hidden_size, 2 * c.intermediate_size, layers),
            "down_proj": (c.intermediate_size, c.hidden_size, layers),
            "lm_head": (c.hidden_size, c.vocab_size, 1)}


def time_linears(config, ceilings: Ceilings) -> tuple[list[LinearTiming], dict[int, float]]:
    timings, per_step = [], {}
    for rows in LINEAR_ROWS:
        per_step[rows] = 0.0
        for name, (size_in, size_out, times) in linear_shapes(config).items():
            weight = torch.randn(size_out, size_in, dtype=torch.bfloat16, device="cuda")
            x = torch.randn(rows, size_in, dtype=torch.bfloat16, device="cuda")
            us = 1e3 * time_graph(lambda: F.linear(x, weight))
            nbytes = weight.numel() * weight.element_size()
            timings.append(LinearTiming(name, rows, us, nbytes,
                                        nbytes / (us / 1e6) / ceilings.copy_bytes_per_s))
            per_step[rows] += us * times
            print(f"linear {name} x{rows}: {us:.1f} us, "
                  f"{timings[-1].fraction_of_copy:.2f} of copy", flush=True)
    return timings, per_step


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    if any(key in lowered for key in ("gemm", "gemv", "cutlass", "xmma", "nvjet", "cublas")):
        return "matmul"
    if "_partial_kernel" in lowered or "_merge_kernel" in lowered:
        return "attention"
    if any(key in lowered for key in ("_add_rms_norm", "_rotate", "_silu")):
        return "fused element-wise"
    if "index_copy" in lowered or "indexing_backward" in lowered or "index_put" in lowered:
        return "kv cache write"
    return "other element-wise"


def _device_us(event) -> float:
    """An averaged profiler row's own GPU time, in microseconds (names vary by version)."""
    for attribute in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, attribute, None)
        if value is not None:
            return float(value)
    return 0.0


def profile_replay(executor, batch_size: int, replays: int = 10) -> StepBreakdown:
    """GPU time per kind of kernel in one replay of the decode graph of `batch_size`."""
    from torch.profiler import ProfilerActivity, profile
    graph = executor.graphs.graphs[batch_size]
    replay_us = 1e3 * time_events(graph.replay, reps=20)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    by_kind: dict[str, float] = {}
    rows = []
    count = 0
    for row in prof.key_averages():
        us = _device_us(row)
        if us <= 0:
            continue
        kind = kernel_kind(row.key)
        by_kind[kind] = by_kind.get(kind, 0.0) + us / replays
        rows.append((row.key[:80], us / replays))
        count += row.count
    rows.sort(key=lambda r: -r[1])
    by_kind["gaps"] = replay_us - sum(by_kind.values())
    return StepBreakdown(batch_size, replay_us, count / replays, by_kind, rows[:12])


def compare_variants(executor, ceilings: Ceilings) -> list[Variant]:
    """The step before this phase's changes and after, on the same loaded model."""
    from engines.models import paged_decode
    from engines.models.elementwise import TorchOps
    from engines.models.loader import select_ops
    fused, tuned = select_ops(executor.device, executor.dtype), paged_decode.TUNING
    variants = []
    for name, ops, tuning in (("torch ops, unpipelined kernel", TorchOps,
                               paged_decode.DecodeTuning(32, 1, 4, 264)),
                              ("fused ops, TUNING", fused, tuned)):
        executor.model.set_ops(ops)
        paged_decode.TUNING = tuning
        executor.recapture_graphs()
        points = [measure_decode(executor, ceilings, n) for n in SWEEP_BATCHES]
        breakdown = [profile_replay(executor, n) for n in PROFILED_BATCHES]
        variants.append(Variant(name, ops.name, (tuning.tile, tuning.stages, tuning.warps,
                                                 tuning.programs), points, breakdown))
        print(f"{name}: " + ", ".join(f"batch {p.batch} {p.graph_ms:.2f} ms "
                                      f"({p.graph_over_roofline:.2f}x)" for p in points),
              flush=True)
        for b in breakdown:
            print(f"  batch {b.batch}: replay {b.replay_us:.0f} us, {b.kernels_per_step:.0f} "
                  "kernels, " + ", ".join(f"{k} {v:.0f}" for k, v in b.us_by_kind.items()),
                  flush=True)
    return variants


def run_kernel_study(executor, ceilings: Ceilings) -> KernelStudy:
    """Every part of the study on `executor` (the 8B-shape model, graphs captured)."""
    variants = compare_variants(executor, ceilings)
    decode_kernel = sweep_decode_kernel(ceilings)
    linears, per_step = time_linears(executor.config, ceilings)
    return KernelStudy(ceilings.device, decode_kernel, linears, per_step, variants)

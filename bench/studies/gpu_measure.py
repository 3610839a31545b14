"""What `python -m bench.studies.gpu_check` measures on one CUDA GPU (its `measure` phase).

The card's two ceilings (device-to-device copy bandwidth, bytes read plus written; bf16
matrix product rate on random data); the Triton paged decode kernel against float64
attention; a Llama-3-8B-shape checkpoint with random weights written by
`make_tiny_model(shape="llama3-8b")` on the GPU and loaded through the real loader; decode
steps at batch 1, 16 and 64 over 1k-token contexts (CUDA graphs and eager) against the HBM
roofline (weights + KV read per step / copy bandwidth); prefill of 2k-token prompts against
the matrix-product bound (the linear layers' and attention's FLOPs / matmul rate); and what
the simulator's GPU profiles predict for the same batches.
"""
from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

import msgspec

from bench.json_file import write_json

DECODE_BATCHES = (1, 16, 64)
DECODE_CONTEXT = 1024
PREFILL_LENGTH = 2048
PREFILL_PROMPTS = (1, 2)
PROFILES = ("a100-llama3-8b", "h100-llama2-7b")


class Ceilings(msgspec.Struct):
    device: str
    torch: str
    triton: str
    copy_bytes_per_s: float       # bytes read + written per second, device to device
    matmul_flops_per_s: float     # bf16 8192^3 product on random data


class KernelCheck(msgspec.Struct):
    dtype: str
    block_size: int
    seqs: int
    max_context: int
    relative_error: float


class DecodePoint(msgspec.Struct):
    batch: int
    context: int
    graph_ms: float               # execute(): inputs, replay, sampling, tokens to the host
    eager_ms: float
    replay_ms: float              # the graph alone, CUDA events
    roofline_ms: float
    graph_over_roofline: float
    bytes_per_step: int
    profile_ms: dict[str, float]


class PrefillPoint(msgspec.Struct):
    prompts: int
    prompt_len: int
    ms: float
    tokens_per_s: float
    matmul_bound_tokens_per_s: float
    fraction_of_bound: float
    profile_ms: dict[str, float]


class GpuCheck(msgspec.Struct):
    ceilings: Ceilings
    kernel_checks: list[KernelCheck]
    model: dict[str, float | int | str]
    decode: list[DecodePoint]
    prefill: list[PrefillPoint]


def _torch():
    import torch
    return torch


def time_events(fn, reps: int, warmup: int = 3) -> float:
    """Median milliseconds of `fn()` between CUDA events."""
    torch = _torch()
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def time_graph(fn, calls: int = 32, reps: int = 20) -> float:
    """Median milliseconds of one `fn()` replayed inside a CUDA graph of `calls`
    back-to-back calls: the GPU's time, without Python's launch cost (as in a decode step,
    where the layers' kernels run inside one graph)."""
    torch = _torch()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: Triton compiles, cuBLAS picks kernels
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return time_events(graph.replay, reps) / calls


def time_host(fn, reps: int, warmup: int = 3) -> float:
    """Median wall milliseconds of `fn()` (which must wait for the GPU itself)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        begin = time.perf_counter()
        fn()
        times.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(times)


def _copy_bytes_per_s() -> float:
    """Bytes read + written per second copying 2 GiB device to device."""
    torch = _torch()
    src = torch.randn(2**30, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    return 2 * 2**31 / (time_events(lambda: dst.copy_(src), reps=20) / 1e3)


def _matmul_flops_per_s() -> float:
    """bf16 FLOP/s of an 8192^3 product on random data."""
    torch = _torch()
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn_like(a)
    return 2 * 8192**3 / (time_events(lambda: a @ b, reps=20) / 1e3)


def measure_ceilings() -> Ceilings:
    torch = _torch()
    import triton
    return Ceilings(torch.cuda.get_device_name(), str(torch.__version__), triton.__version__,
                    copy_bytes_per_s=_copy_bytes_per_s(),
                    matmul_flops_per_s=_matmul_flops_per_s())


def check_kernel() -> list[KernelCheck]:
    """The decode kernel against float64 attention, at the serving shape (32 query heads,
    8 KV heads, head_dim 128), block sizes 16 and 256, contexts up to 8k."""
    torch = _torch()
    from engines.models.paged_decode import paged_decode_attention
    checks = []
    for dtype in (torch.bfloat16, torch.float16):
        for block in (16, 256):
            torch.manual_seed(block)
            num_blocks = 8192 * 8 // block
            k_cache = torch.randn(num_blocks, block, 8, 128, dtype=dtype, device="cuda")
            v_cache = torch.randn_like(k_cache)
            lens = [0, 1, 17, 1000, 4097, 8192]
            width = 8192 // block
            tables = torch.randperm(num_blocks)[:len(lens) * width].view(len(lens), width)
            tables = tables.int().cuda()
            lens_t = torch.tensor(lens, dtype=torch.int32, device="cuda")
            q = torch.randn(len(lens), 32, 128, dtype=dtype, device="cuda")
            out = paged_decode_attention(q, k_cache, v_cache, tables, lens_t)
            expected = _reference_decode(q, k_cache, v_cache, tables, lens)
            error = float((out.double() - expected).norm() / expected.norm())
            checks.append(KernelCheck(str(dtype).removeprefix("torch."), block, len(lens),
                                      max(lens), error))
    return checks


def _reference_decode(q, k_cache, v_cache, tables, lens):
    torch = _torch()
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    block = k_cache.shape[1]
    for i, length in enumerate(lens):
        if length:
            blocks = tables[i, :-(-length // block)].long()
            keys = k_cache[blocks].flatten(0, 1)[:length].double().repeat_interleave(4, 1)
            values = v_cache[blocks].flatten(0, 1)[:length].double().repeat_interleave(4, 1)
            scores = torch.einsum("hd,khd->hk", q[i].double(), keys) / 128 ** 0.5
            out[i] = torch.einsum("hk,khd->hd", scores.softmax(-1), values)
    return out


def _requests(executor, num: int, prompt_len: int, decode: bool, rng: random.Random):
    """`num` requests of `prompt_len` random prompt tokens on shuffled blocks; `decode`:
    the prompt is cached (random K/V written into its blocks) and one token sampled."""
    torch = _torch()
    from engines.request import Request
    from ipc.params import SamplingParams
    blocks = list(range(executor.num_kv_blocks))
    rng.shuffle(blocks)
    requests = []
    for i in range(num):
        request = Request(f"r{i}", [rng.randrange(1000) for _ in range(prompt_len)],
                          SamplingParams(max_tokens=16))
        request.block_table = [blocks.pop() for _ in range(-(-(prompt_len + 1)
                                                              // executor.block_size))]
        if decode:
            request.token_ids.append(rng.randrange(1000))
            request.num_computed_tokens = prompt_len
            used = torch.tensor(request.block_table, device="cuda")
            for k_cache, v_cache in executor.kv_caches:
                k_cache[used] = torch.randn_like(k_cache[used])
                v_cache[used] = torch.randn_like(v_cache[used])
        requests.append(request)
    return requests


def _profile_ms(batch) -> dict[str, float]:
    from engines.executors.profiles import profile_latency
    return {name: profile_latency(name)(batch) * 1e3 for name in PROFILES}


def _param_bytes(executor) -> tuple[int, int]:
    """(bytes of all parameters, bytes of the embedding table)."""
    model = executor.model
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.model.embed_tokens.weight
    return total, embed.numel() * embed.element_size()


def measure_decode(executor, ceilings: Ceilings, batch_size: int) -> DecodePoint:
    """One decode step of `batch_size` sequences at DECODE_CONTEXT tokens of context."""
    from engines.batch import Batch
    config = executor.config
    requests = _requests(executor, batch_size, DECODE_CONTEXT - 1, True, random.Random(batch_size))
    batch = Batch()
    batch.add_decodes(requests)
    graph_ms = time_host(lambda: executor.execute(batch), reps=30)
    size = next(s for s in executor.graphs.sizes if s >= batch_size)
    replay_ms = time_events(executor.graphs.graphs[size].replay, reps=30)
    graphs, executor.graphs = executor.graphs, None
    try:
        eager_ms = time_host(lambda: executor.execute(batch), reps=10)
    finally:
        executor.graphs = graphs
    total, embed = _param_bytes(executor)
    element = 2  # bf16
    weights = total - embed + batch_size * config.hidden_size * element
    kv = batch_size * DECODE_CONTEXT * config.num_hidden_layers * 2 * config.kv_size * element
    roofline_ms = (weights + kv) / ceilings.copy_bytes_per_s * 1e3
    return DecodePoint(batch_size, DECODE_CONTEXT, graph_ms, eager_ms, replay_ms, roofline_ms,
                       graph_ms / roofline_ms, weights + kv, _profile_ms(batch))


def measure_prefill(executor, ceilings: Ceilings, prompts: int) -> PrefillPoint:
    from engines.batch import Batch
    c = executor.config
    requests = _requests(executor, prompts, PREFILL_LENGTH, False, random.Random(prompts))
    batch = Batch()
    for request in requests:
        batch.add(request, PREFILL_LENGTH)
    ms = time_host(lambda: executor.execute(batch), reps=10)
    tokens = prompts * PREFILL_LENGTH
    linear = c.num_hidden_layers * c.hidden_size * (c.q_size + 2 * c.kv_size + c.q_size
                                                    + 3 * c.intermediate_size)
    causal_pairs = PREFILL_LENGTH * (PREFILL_LENGTH + 1) / 2 * prompts
    flops = (2 * linear * tokens + 4 * c.num_hidden_layers * c.q_size * causal_pairs
             + 2 * c.vocab_size * c.hidden_size * prompts)
    bound = tokens / (flops / ceilings.matmul_flops_per_s)
    rate = tokens / (ms / 1e3)
    return PrefillPoint(prompts, PREFILL_LENGTH, ms, rate, bound, rate / bound,
                        _profile_ms(batch))


def make_model(model_dir: Path) -> dict[str, float | int | str]:
    from engines.models.tiny import make_tiny_model
    if (model_dir / "config.json").exists():
        return {"dir": str(model_dir), "write_s": 0.0}
    begin = time.perf_counter()
    make_tiny_model(model_dir, shape="llama3-8b", device="cuda")
    return {"dir": str(model_dir), "write_s": time.perf_counter() - begin}


def run_measure(out: Path, model_dir: Path, then=None) -> GpuCheck:
    """The tables of docs/gpu.md -> out/gpu_check.json; then `then(executor, ceilings)`
    on the same loaded model, if given."""
    torch = _torch()
    from engines.executors.torch_executor import TorchExecutor
    ceilings = measure_ceilings()
    print(f"{ceilings.device}: copy {ceilings.copy_bytes_per_s / 1e12:.2f} TB/s, "
          f"matmul {ceilings.matmul_flops_per_s / 1e12:.0f} TFLOP/s", flush=True)
    checks = check_kernel()
    for check in checks:
        print(f"kernel {check.dtype} block {check.block_size}: relative error "
              f"{check.relative_error:.2e}", flush=True)
    model = make_model(model_dir)
    torch.cuda.empty_cache()
    begin = time.perf_counter()
    executor = TorchExecutor(model_dir, block_size=16, num_kv_blocks=16384, device="cuda",
                             cuda_graph_max_batch=64)
    model["load_and_capture_s"] = time.perf_counter() - begin
    model["attention"] = executor.attention.name
    model["params"] = sum(p.numel() for p in executor.model.parameters())
    print(f"model: {model}", flush=True)
    decode = [measure_decode(executor, ceilings, n) for n in DECODE_BATCHES]
    prefill = [measure_prefill(executor, ceilings, n) for n in PREFILL_PROMPTS]
    result = GpuCheck(ceilings, checks, model, decode, prefill)
    print_tables(result)
    write_json(out / "gpu_check.json", result)
    if then is not None:
        then(executor, ceilings)
    del executor
    torch.cuda.empty_cache()
    return result


def print_tables(result: GpuCheck) -> None:
    print(f"\ndecode, context {DECODE_CONTEXT} ({result.ceilings.device})")
    print("batch  graph ms  eager ms  replay ms  roofline ms  graph/roofline  "
          + "  ".join(f"{p} ms" for p in PROFILES))
    for d in result.decode:
        print(f"{d.batch:5d}  {d.graph_ms:8.2f}  {d.eager_ms:8.2f}  {d.replay_ms:9.2f}  "
              f"{d.roofline_ms:11.2f}  {d.graph_over_roofline:14.2f}  "
              + "  ".join(f"{d.profile_ms[p]:{len(p) + 3}.2f}" for p in PROFILES))
    print(f"\nprefill, {PREFILL_LENGTH}-token prompts")
    print("prompts  ms  tokens/s  bound tokens/s  fraction  "
          + "  ".join(f"{p} ms" for p in PROFILES))
    for p in result.prefill:
        print(f"{p.prompts:7d}  {p.ms:.1f}  {p.tokens_per_s:.0f}  {p.matmul_bound_tokens_per_s:.0f}"
              f"  {p.fraction_of_bound:.2f}  "
              + "  ".join(f"{p.profile_ms[name]:.1f}" for name in PROFILES))

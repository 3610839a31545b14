"""How many tokens of KV cache fit on one GPU: vLLM's budget after its memory profiling.

    KV bytes = utilization x total memory - weights - reserve
    tokens   = KV bytes / (2 x layers x kv_heads x head_dim x bytes per element)

as vLLM sizes it (vllm-project/vllm V0 `Worker.determine_num_available_blocks`:
num_gpu_blocks = (total_gpu_memory x gpu_memory_utilization - peak_memory) // block
bytes, peak_memory being the weights plus the profiling pass's peak). The reserve is
memory_reserve.py's: the activation peak of a pass of `max_num_batched_tokens` tokens
in `max_num_seqs` sequences, and the CUDA graphs. K and V have kv_heads heads (GQA).

Total memory is what CUDA reports, not the marketing size (vLLM's `total_gpu_memory`):
* A100 80 GB: 79.15 GiB (a vLLM 0.8.2 log on an NVIDIA A100-SXM4-80GB, printed in a public
  Unsloth GRPO notebook: "total_gpu_memory (79.15GiB)"; driver versions move it ~0.1 GiB);
* H100 80 GB: 79.22 GiB (vLLM pull request #12126, run on an H100-80G: "total_gpu_memory
  (79.22GiB)").

Published block counts this reproduces (block size 16; bench/studies/profile_check.py prints them):
* Llama-2-7B, TP 1, one A100-80GB: 7,351 blocks (vLLM pull request #2031, Dec 2023,
  max_num_batched_tokens 4096 = its context; that vLLM counted its CUDA context where we
  count graphs, both ~0.4 GiB): we give 7,401 (+0.7 %).
* Llama-3-8B-Instruct bf16, TP 1, vLLM 0.4.1, max_seq_len 8192: 27,793 blocks (the
  startup log in NVIDIA's Elastic NIM guide for llama3-8b-instruct; the GPU model is not
  printed, the 14.96 GiB of weights and the count fit an 80 GB card): we give 27,979 on an
  A100-80G (+0.7 %). The former model (80 GiB, no reserve) gave 29,206 (+5.1 %).
* Meta-Llama-3-8B on a 79.22 GiB card (vLLM pull request #10511's check): 53.29 GiB of
  KV cache = 27,284 blocks; we give 28,011 at 79.22 GiB (+2.7 %): that run also counted
  1.79 GiB of non-torch memory, which memory_reserve.py leaves out (0.06-0.35 GiB in
  other TP-1 logs).
"""
from __future__ import annotations

from engines.executors.profiles.memory_reserve import (
    PROFILE_NUM_SEQS, PROFILE_NUM_TOKENS, reserve_bytes,
)
from engines.perf.model_shape import ModelShape

#: Total device memory CUDA reports, by HardwareSpec name (sources above).
GPU_MEMORY_BYTES = {"a100": int(79.15 * 2**30), "h100": int(79.22 * 2**30)}
#: vLLM's default `gpu_memory_utilization`.
MEMORY_UTILIZATION = 0.9


def weight_bytes(model: ModelShape) -> int:
    """Decoder layers, the embedding and an untied LM head (norms are negligible)."""
    elements = model.layers * model.layer_weights + 2 * model.vocab * model.hidden
    return elements * model.bytes_per_element


def kv_bytes_per_token(model: ModelShape) -> int:
    return 2 * model.layers * model.kv_size * model.bytes_per_element


def kv_budget_bytes(model: ModelShape, memory_bytes: int,
                    utilization: float = MEMORY_UTILIZATION, num_tokens: int = PROFILE_NUM_TOKENS,
                    num_seqs: int = PROFILE_NUM_SEQS) -> float:
    """Bytes left for the KV cache; ValueError when the weights and reserve do not fit."""
    taken = weight_bytes(model) + reserve_bytes(model, num_tokens, num_seqs)
    free = utilization * memory_bytes - taken
    if free <= 0:
        raise ValueError(f"the weights and reserve ({taken / 2**30:.1f} GiB) do not fit in "
                         f"{utilization:.0%} of {memory_bytes / 2**30:.1f} GiB")
    return free


def kv_capacity_tokens(model: ModelShape, memory_bytes: int,
                       utilization: float = MEMORY_UTILIZATION,
                       num_tokens: int = PROFILE_NUM_TOKENS,
                       num_seqs: int = PROFILE_NUM_SEQS) -> int:
    """Tokens of KV cache that fit (`num_tokens`, `num_seqs`: the step's token budget and
    sequence limit, i.e. vLLM's max_num_batched_tokens and max_num_seqs)."""
    budget = kv_budget_bytes(model, memory_bytes, utilization, num_tokens, num_seqs)
    return int(budget // kv_bytes_per_token(model))

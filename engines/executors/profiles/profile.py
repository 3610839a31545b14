"""A GPU latency profile: the predicted seconds of one engine step for a BatchShape.

    step = layers x (9 per-layer ops at the batch's token count      [Vidur, interpolated]
                     + attention of its prefill chunks and decodes)   [roofline, calibrated]
           + embedding                                                [Vidur `emb` column]
           + LM head over the sequences that sample                   [GEMM scaled from Vidur]
           + the executor's CPU work per step                         [Vidur, cpu_overhead.py]

LM head: a [n, hidden] x [hidden, vocab] GEMM has the same inner dimension as the layer's
GEMMs, so it takes the four layer GEMMs' measured time at n tokens scaled by the ratio of
weight elements (vocab x hidden / layer GEMM weights): the same bandwidth while n is small
(weights dominate) and the same FLOP efficiency once n is large.

Overhead: preparing the input tensors and sampling, a line in the step's sequences and
sampling sequences fitted on Vidur's A100 CPU-overhead profile (cpu_overhead.py states the
numbers and the source). The scheduler's own time is left out: the daemon runs the real
scheduler, so it is spent for real (and the discrete-event simulator charges none).

Memory: the KV capacity is vLLM's budget after weights, the activation peak of a profiling
pass at the step's token budget and sequence limit, and CUDA graphs (capacity.py,
memory_reserve.py); `kv_capacity(max_num_batched_tokens, max_num_seqs)` takes the
scheduler's values, the property `kv_capacity_tokens` vLLM's defaults (8192, 256).

Tensor parallelism (`tp` > 1, `at_tp`): an instance over `tp` GPUs of one node, as vLLM
runs it (Megatron layers, vocab-parallel embedding and LM head). The per-layer ops are
Vidur's rows at that degree (one rank's share, measured); each layer adds two all-reduces
of tokens x hidden fp16 values (Vidur's NCCL all-reduce profile of the GPU's DGX node,
all_reduce.py); attention is the roofline's over the rank's heads (`shard_shape`); memory
is one GPU's: the rank's weights, its KV heads (a KV head replicated when there are fewer
than `tp`) and its activation reserve, so `kv_capacity` is the instance's token capacity.
"""
from __future__ import annotations

from dataclasses import dataclass

import dataclasses

from engines.executors.profiles.all_reduce import load_all_reduce
from engines.executors.profiles.attention_time import (
    FLASHINFER_A100, AttentionCalibration, attention_seconds,
)
from engines.executors.profiles.kv_capacity import (
    GPU_MEMORY_BYTES, MEMORY_UTILIZATION, kv_bytes_per_token, kv_capacity_tokens, weight_bytes,
)
from engines.executors.profiles.cpu_overhead import VIDUR_SARATHI_A100, CpuOverhead
from engines.executors.profiles.memory_reserve import (
    PROFILE_NUM_SEQS, PROFILE_NUM_TOKENS, activation_peak_bytes, cuda_graph_bytes,
)
from engines.executors.profiles.op_table import OpTable, load_op_table
from policies.batch_shape import BatchShape
from engines.perf.hardware_spec import HardwareSpec
from engines.perf.model_shape import ModelShape


@dataclass(frozen=True)
class StepTime:
    """Seconds of one step, by part."""
    linear: float
    attention: float
    embedding: float
    lm_head: float
    overhead: float

    @property
    def total(self) -> float:
        return self.linear + self.attention + self.embedding + self.lm_head + self.overhead


@dataclass(frozen=True)
class GpuProfile:
    name: str
    #: the Vidur operator file under profiles/vidur/ that gives the per-layer op times
    ops_file: str
    model: ModelShape
    hardware: HardwareSpec
    description: str = ""
    attention: AttentionCalibration = FLASHINFER_A100
    cpu_overhead: CpuOverhead = VIDUR_SARATHI_A100
    #: total device memory; None = capacity.GPU_MEMORY_BYTES of the hardware
    memory_bytes: int | None = None
    memory_utilization: float = MEMORY_UTILIZATION
    #: tensor-parallel degree: GPUs (ranks) of one instance
    tp: int = 1
    #: the Vidur all-reduce file of the GPU's node ("" = the profile has no TP data)
    network_file: str = ""

    @property
    def ops(self) -> OpTable:
        """The operator table at the profile's degree (read on first use, then cached)."""
        return load_op_table(self.ops_file, self.tp)

    @property
    def shard_shape(self) -> ModelShape:
        """One rank's share of the model: its heads, KV heads, MLP columns and vocabulary."""
        m, k = self.model, self.tp
        if k == 1:
            return m
        return dataclasses.replace(m, heads=m.heads // k, kv_heads=max(1, m.kv_heads // k),
                                   intermediate=m.intermediate // k, vocab=-(-m.vocab // k))

    def at_tp(self, tp: int) -> "GpuProfile":
        """This profile over `tp` GPUs; ValueError naming `tp` when there are no data."""
        if tp == self.tp:
            return self
        if tp > 1 and not self.network_file:
            raise ValueError(f"tp: profile {self.name!r} has no all-reduce data for tp {tp}")
        if self.model.heads % tp:
            raise ValueError(f"tp: the model's {self.model.heads} attention heads are not "
                             f"divisible by tp={tp}")
        profile = dataclasses.replace(self, tp=tp, name=tp_name(self.name.split("@")[0], tp))
        profile.ops  # ValueError: no rows at this degree
        return profile

    def all_reduce_seconds(self, num_tokens: int) -> float:
        """One all-reduce of a step's hidden states (fp16) over the instance's GPUs."""
        if self.tp == 1:
            return 0.0
        return load_all_reduce(self.network_file).seconds(self.tp, num_tokens * self.model.hidden * 2)

    def breakdown(self, shape: BatchShape, num_sampling: int | None = None) -> StepTime:
        """Each part of the step time. `num_sampling`: sequences whose logits are computed
        (None: every sequence, as engines.perf.features counts)."""
        tokens = shape.num_tokens
        if tokens == 0:
            return StepTime(0.0, 0.0, 0.0, 0.0, 0.0)
        ops, model = self.ops, self.model
        rows = shape.num_seqs if num_sampling is None else num_sampling
        head_scale = model.vocab * model.hidden / ops.gemm_weights
        linear = model.layers * ops.layer(tokens)
        if self.tp > 1:
            linear += 2 * model.layers * self.all_reduce_seconds(tokens)
        return StepTime(
            linear=linear,
            attention=model.layers * attention_seconds(shape, self.shard_shape, self.hardware,
                                                       self.attention),
            embedding=ops.emb(tokens),
            lm_head=head_scale * ops.gemm(rows),
            overhead=self.cpu_overhead.seconds(shape.num_seqs, rows),
        )

    def step_time(self, shape: BatchShape, num_sampling: int | None = None) -> float:
        """Predicted seconds of one engine step running `shape`."""
        return self.breakdown(shape, num_sampling).total

    # -- memory -------------------------------------------------------------------------
    @property
    def total_memory_bytes(self) -> int:
        if self.memory_bytes is not None:
            return self.memory_bytes
        return GPU_MEMORY_BYTES[self.hardware.name]

    @property
    def weight_bytes(self) -> int:
        return weight_bytes(self.shard_shape)

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.shard_shape)

    def activation_bytes(self, max_num_batched_tokens: int = PROFILE_NUM_TOKENS,
                         max_num_seqs: int = PROFILE_NUM_SEQS) -> int:
        return activation_peak_bytes(self.shard_shape, max_num_batched_tokens, max_num_seqs)

    @property
    def cuda_graph_bytes(self) -> int:
        return cuda_graph_bytes(self.shard_shape)

    def kv_capacity(self, max_num_batched_tokens: int = PROFILE_NUM_TOKENS,
                    max_num_seqs: int = PROFILE_NUM_SEQS) -> int:
        """Tokens of KV cache that fit beside the weights and the reserve of a step of
        `max_num_batched_tokens` tokens in `max_num_seqs` sequences."""
        try:
            return kv_capacity_tokens(self.shard_shape, self.total_memory_bytes,
                                      self.memory_utilization, max_num_batched_tokens,
                                      max_num_seqs)
        except ValueError as exc:
            raise ValueError(f"profile {self.name}: {exc} (a larger tp spreads the weights "
                             f"over more GPUs)") from None

    @property
    def kv_capacity_tokens(self) -> int:
        """`kv_capacity()` at vLLM's defaults (8192 batched tokens, 256 sequences)."""
        return self.kv_capacity()

    def num_kv_blocks(self, block_size: int, max_num_batched_tokens: int = PROFILE_NUM_TOKENS,
                      max_num_seqs: int = PROFILE_NUM_SEQS) -> int:
        """KV cache blocks of `block_size` tokens that fit on the GPU (the step's token
        budget and sequence limit size the activation reserve; vLLM's defaults if unset)."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        return self.kv_capacity(max_num_batched_tokens, max_num_seqs) // block_size


def tp_name(base: str, tp: int) -> str:
    """The name of profile `base` over `tp` GPUs: `base` itself at 1, else `base@tp<k>`."""
    return base if tp == 1 else f"{base}@tp{tp}"

"""A GPU latency profile: the predicted seconds of one engine step for a BatchShape.

    step = layers x (9 per-layer ops at the batch's token count      [Vidur, interpolated]
                     + attention of its prefill chunks and decodes)   [roofline, calibrated]
           + embedding                                                [Vidur `emb` column]
           + LM head over the sequences that sample                   [GEMM scaled from Vidur]
           + a per-iteration overhead                                 [constant, below]

LM head: a [n, hidden] x [hidden, vocab] GEMM has the same inner dimension as the layer's
GEMMs, so it takes the four layer GEMMs' measured time at n tokens scaled by the ratio of
weight elements (vocab x hidden / layer GEMM weights): the same bandwidth while n is small
(weights dominate) and the same FLOP efficiency once n is large.

Overhead, FRAMEWORK_OVERHEAD_S = 1.2 ms: the per-step work a real executor does that the
operator profile does not hold and the sim executor does not do -- preparing the input
tensors and sampling. The value is an assumption of the order Vidur's published A100
CPU-overhead profile (not in shared/) shows for a 7B model at batch 8. The scheduler's own
time is left out: the daemon runs the real scheduler, so it is spent for real.
The shared sarathi/splitwise files cannot pin this down: their models run at TP >= 2, where
the residual also holds all-reduces.
"""
from __future__ import annotations

from dataclasses import dataclass

from engines.executors.profiles.attention import (
    FLASHINFER_A100, AttentionCalibration, attention_seconds,
)
from engines.executors.profiles.capacity import (
    GPU_MEMORY_BYTES, MEMORY_UTILIZATION, kv_bytes_per_token, kv_capacity_tokens, weight_bytes,
)
from engines.executors.profiles.op_table import OpTable, load_op_table
from policies.batch_shape import BatchShape
from policies.hardware_spec import HardwareSpec
from policies.model_shape import ModelShape

FRAMEWORK_OVERHEAD_S = 1.2e-3


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
    overhead_s: float = FRAMEWORK_OVERHEAD_S
    memory_bytes: int = GPU_MEMORY_BYTES
    memory_utilization: float = MEMORY_UTILIZATION

    @property
    def ops(self) -> OpTable:
        """The operator table (read on first use, then cached for the process)."""
        return load_op_table(self.ops_file)

    def breakdown(self, shape: BatchShape, num_sampling: int | None = None) -> StepTime:
        """Each part of the step time. `num_sampling`: sequences whose logits are computed
        (None: every sequence, as policies.perf_features counts)."""
        tokens = shape.num_tokens
        if tokens == 0:
            return StepTime(0.0, 0.0, 0.0, 0.0, 0.0)
        ops, model = self.ops, self.model
        rows = shape.num_seqs if num_sampling is None else num_sampling
        head_scale = model.vocab * model.hidden / ops.gemm_weights
        return StepTime(
            linear=model.layers * ops.layer(tokens),
            attention=model.layers * attention_seconds(shape, model, self.hardware,
                                                       self.attention),
            embedding=ops.emb(tokens),
            lm_head=head_scale * ops.gemm(rows),
            overhead=self.overhead_s,
        )

    def step_time(self, shape: BatchShape, num_sampling: int | None = None) -> float:
        """Predicted seconds of one engine step running `shape`."""
        return self.breakdown(shape, num_sampling).total

    # -- memory -------------------------------------------------------------------------
    @property
    def weight_bytes(self) -> int:
        return weight_bytes(self.model)

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.model)

    @property
    def kv_capacity_tokens(self) -> int:
        return kv_capacity_tokens(self.model, self.memory_bytes, self.memory_utilization)

    def num_kv_blocks(self, block_size: int) -> int:
        """KV cache blocks of `block_size` tokens that fit on the GPU."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        return self.kv_capacity_tokens // block_size

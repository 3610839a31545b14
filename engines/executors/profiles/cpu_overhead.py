"""The per-step CPU work of a real executor that the GPU operator profile does not hold:
preparing the step's input tensors and sampling, as a function of the batch's sequences.

    overhead = PREPARE_BASE + PREPARE_PER_SEQ x num_seqs
             + (SAMPLER_BASE + SAMPLER_PER_SEQ x num_sampling   if any sequence samples)

Source: Vidur's CPU-overhead profile of the Sarathi-Serve engine on an A100,
`data/profiling/a100/cpu_overheads.csv` of microsoft/vidur at commit 6d98aa8f (its last
version, blob bf106186; deleted from the repository later; MIT licence), rows
Llama-2-7b-hf at tensor-parallel degree 1, batch sizes 8-128: least-squares lines through
the medians of
* `prepare_inputs_e2e` (building the input, position and block-table tensors):
  0.259 ms + 5.85 us per sequence (within 9.2 % of every point);
* `sampler_e2e` (logits to sampled token ids, with its GPU sync):
  0.453 ms + 5.30 us per sequence (within 6.8 %).
Their sum is 0.846 ms at batch 8, 1.042 ms at 32, 1.430 ms at 64 and 2.125 ms at 128
(VIDUR_POINTS); the phi-2 rows of the same file agree within 5 %, so the model and its
vocabulary barely matter. Vidur predicts these from the batch size only (its
`sklearn_execution_time_predictor` trains them on `batch_size`), so there is no
per-token term. The sampler's part is charged only when a sequence samples (a step of
non-final prefill chunks has nothing to sample); prepare-inputs always. The same line
serves every profile, the H100 one too: the host CPU, not the GPU, sets it (an assumption).

Left out, on purpose: `schedule` (~16 us per sequence) and `process_model_outputs`
(appending tokens, stop checks, freeing blocks; ~16 us per sequence). That is the
scheduler's own work, and Ascendra runs its real scheduler (Scheduler.schedule/update)
for real: the daemon spends that time on its own clock, and the discrete-event simulator
charges it nothing. The profile models the executor only.

The former model was a constant 1.2 ms; this one is 0.80 ms at batch 8, 1.07 ms at 32 and
2.14 ms at 128 (sarathi-serve's Python engine; vLLM's later engines trim it).
"""
from __future__ import annotations

from dataclasses import dataclass

#: (batch size, prepare_inputs_e2e + sampler_e2e median, ms): Vidur's A100 Llama-2-7B
#: TP-1 points the lines are checked against (the file above)
VIDUR_POINTS = ((8, 0.846), (32, 1.042), (64, 1.430), (128, 2.125))


@dataclass(frozen=True)
class CpuOverhead:
    prepare_base_s: float = 0.259e-3
    prepare_per_seq_s: float = 5.85e-6
    sampler_base_s: float = 0.453e-3
    sampler_per_seq_s: float = 5.30e-6

    def seconds(self, num_seqs: int, num_sampling: int) -> float:
        """CPU seconds of a step over `num_seqs` sequences of which `num_sampling` sample."""
        if num_seqs <= 0:
            return 0.0
        prepare = self.prepare_base_s + self.prepare_per_seq_s * num_seqs
        if not num_sampling:
            return prepare
        return prepare + self.sampler_base_s + self.sampler_per_seq_s * num_sampling


VIDUR_SARATHI_A100 = CpuOverhead()

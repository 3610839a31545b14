"""CUDA graphs of the decode step, one per batch size of a ladder (as vLLM captures them).

A decode step at small batch launches ~14 kernels per layer (455 for the 8B shape, with
the fused element-wise kernels), each a few microseconds of GPU work behind tens of
microseconds of Python and launch overhead. Captured once per
batch size, the step is one graph launch: the host copies the step's inputs into static
buffers (one pinned staging copy each) and replays the graph of the smallest captured size
that holds the batch. Rows past the batch are padding: context length 0 (the attention
kernel writes zeros for them) and their K/V written to a spare block that no request
owns, `pad_block`.

The graphs read the KV cache tensors and the model's weights in place, so they stay valid
as long as the executor keeps those tensors.
"""
from __future__ import annotations

import logging
import time

import torch

from engines.models.paged_kv import SeqSpec
from engines.models.triton_attention import PagedDecodeMetadata, TritonMetadata, decode_arrays

log = logging.getLogger(__name__)


def capture_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to `max_batch` (vLLM's ladder)."""
    sizes = [n for n in (1, 2, 4, 8) if n <= max_batch]
    sizes += list(range(16, max_batch + 1, 8))
    if max_batch not in sizes:
        sizes.append(max_batch)
    return sizes


class DecodeGraphs:
    def __init__(self, model, kv_caches, *, max_batch: int, max_model_len: int,
                 block_size: int, pad_block: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.pad_slot = pad_block * block_size
        self.width = -(-max_model_len // block_size)
        self.sizes = capture_sizes(max_batch)
        self.max_batch = self.sizes[-1]
        n = self.max_batch
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slots = torch.full((n,), self.pad_slot, dtype=torch.long, device=device)
        self.tables = torch.zeros((n, self.width), dtype=torch.int32, device=device)
        self.lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.rows = torch.arange(n, dtype=torch.long, device=device)
        #: every graph writes its logits here, so the sizes share one output buffer
        self.logits = torch.empty((n, model.config.vocab_size), dtype=dtype, device=device)
        # host side: one pinned buffer per step input, filled with numpy, copied at once
        self.host = {name: torch.zeros(t.shape, dtype=t.dtype).pin_memory()
                     for name, t in self._inputs().items()}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def _inputs(self) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids, "positions": self.positions,
                "slots": self.slots, "tables": self.tables, "lens": self.lens}

    def _forward(self, size: int) -> torch.Tensor:
        decodes = PagedDecodeMetadata(self.slots[:size], self.tables[:size], self.lens[:size])
        meta = TritonMetadata(num_decodes=size, decodes=decodes, prefills=None)
        return self.model(self.input_ids[:size], self.positions[:size], self.kv_caches, meta,
                          self.rows[:size])

    @torch.inference_mode()
    def capture(self) -> float:
        """Capture every size, largest first (the smaller ones reuse its memory pool);
        returns the seconds it took."""
        begin = time.perf_counter()
        pool = None
        side = torch.cuda.Stream()
        for size in reversed(self.sizes):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up: Triton compiles, cuBLAS picks kernels
                for _ in range(2):
                    self._forward(size)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[:size].copy_(self._forward(size))
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()
        seconds = time.perf_counter() - begin
        log.info("captured %d decode graphs (batch %d..%d) in %.1f s", len(self.sizes),
                 self.sizes[0], self.max_batch, seconds)
        return seconds

    def fits(self, num_seqs: int) -> bool:
        return 0 < num_seqs <= self.max_batch

    def run(self, token_ids: list[int], seqs: list[SeqSpec]) -> torch.Tensor:
        """Logits [len(seqs), vocab] of one-token sequences `seqs` (their new tokens
        `token_ids`), by replaying the smallest graph that holds them."""
        n = len(seqs)
        size = next(s for s in self.sizes if s >= n)
        slots, tables, lens = decode_arrays(seqs, self.block_size)
        host = self.host
        host["input_ids"][:n].numpy()[:] = token_ids
        host["positions"][:n].numpy()[:] = lens - 1
        host["slots"].numpy()[:n] = slots
        host["slots"].numpy()[n:size] = self.pad_slot
        host["lens"].numpy()[:n] = lens
        host["lens"].numpy()[n:size] = 0
        host["tables"].numpy()[:n, :tables.shape[1]] = tables
        # whole rows, contiguous: one plain copy each (the step before has synchronised on
        # its sampled tokens, so these pinned buffers are free to refill)
        for name, device_tensor in self._inputs().items():
            device_tensor[:size].copy_(host[name][:size], non_blocking=True)
        self.graphs[size].replay()
        return self.logits[:n]

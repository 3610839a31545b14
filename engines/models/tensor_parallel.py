"""One rank's share of a Llama-family model under Megatron-style tensor parallelism.

Of K ranks, rank r holds:

* q/k/v and gate/up **column-parallel**: the query heads `heads(r)`, the KV heads
  `kv_heads(r)` and the intermediate columns `intermediate(r)`. When the model has fewer
  KV heads than ranks, each KV head is replicated on K / kv_heads consecutive ranks (the
  query heads of a rank always map onto its own KV head, as GQA groups are contiguous).
* o_proj and down_proj **row-parallel**: the input columns matching those heads /
  intermediate columns; each rank's partial product is summed with one all-reduce, and a
  bias is added once, after it.
* the embedding, the norms and the LM head **replicated**. Why not vocab-parallel: the
  sampler runs once, on rank 0, and needs the whole logits row (penalties, top-p, seeded
  draws, log-probabilities), so a vocab-parallel head would only add a gather of
  [rows, vocab] to every step; replicating costs vocab x hidden per rank (Llama-3-70B in
  bf16: 2 x 1.05 GB of ~17.5 GB a rank at K = 8), which we accept for one collective fewer
  per step and an unchanged sampler.

The KV cache of a rank holds its `kv_heads(r)` only, with the same block table on every
rank, so the scheduler, prefix caching, preemption and hand-offs (which see blocks, not
heads) are unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch only where a rank runs: the daemon checks degrees without it
    import torch


@dataclass(frozen=True)
class Shard:
    """Rank `rank` of `size`; `all_reduce` sums over the ranks' group (torch.distributed)."""

    rank: int = 0
    size: int = 1
    #: the torch.distributed group of the all-reduces; None = the default group
    group: object = None
    #: the group of host-side collectives (engines/tp_group.py); None = the default group
    control: object = None

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tp: rank {self.rank} is not in 0..{self.size - 1}")

    @property
    def parallel(self) -> bool:
        return self.size > 1

    def heads(self, config) -> range:
        """This rank's query heads."""
        per = config.num_attention_heads // self.size
        return range(self.rank * per, (self.rank + 1) * per)

    def kv_heads(self, config) -> range:
        """This rank's KV heads: its share, or the one head its query heads use when the
        model has fewer KV heads than ranks (replicated)."""
        kv = config.num_key_value_heads
        if kv >= self.size:
            per = kv // self.size
            return range(self.rank * per, (self.rank + 1) * per)
        head = self.rank * kv // self.size
        return range(head, head + 1)

    def intermediate(self, config) -> range:
        per = config.intermediate_size // self.size
        return range(self.rank * per, (self.rank + 1) * per)

    def all_reduce(self, tensor: "torch.Tensor") -> "torch.Tensor":
        """Sum `tensor` over the ranks in place (a no-op on one rank)."""
        if self.size > 1:
            import torch.distributed as dist
            dist.all_reduce(tensor, group=self.group)
        return tensor


def check_divisible(config, size: int, setting: str = "tp") -> None:
    """ValueError naming `setting` when the model cannot be split over `size` ranks."""
    if size < 1:
        raise ValueError(f"{setting}: must be at least 1, got {size}")
    if size == 1:
        return
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    if heads % size:
        raise ValueError(f"{setting}: the model's {heads} attention heads are not divisible "
                         f"by {setting}={size}")
    if kv % size and size % kv:
        raise ValueError(f"{setting}: the model's {kv} KV heads neither divide nor are divisible "
                         f"by {setting}={size}")
    if config.intermediate_size % size:
        raise ValueError(f"{setting}: the model's intermediate size {config.intermediate_size} is "
                         f"not divisible by {setting}={size}")

"""What an ESP prefill (engines/models/sequence_parallel.py) costs on a GPU profile: one
step in which each of k GPUs computes its stripe of the whole prompt, with one all-gather
of the layer's new KV per layer.

**Compute.** A rank's stripe is ceil(n/k) query tokens whose keys are every earlier prompt
position: its causal work is 1/k of the whole prompt's, n^2 / (2k) (query, key) pairs.
The profile prices a prefill chunk of c new tokens after l cached ones, c*l + c^2/2
pairs, so the stripe is priced as the chunk c = ceil(n/k) after l = n(k-1)/(2k): the same
tokens through the layers' matrix products and the same attention pairs.

**Exchange.** The all-gather is priced from the all-reduce table the tensor-parallel
profiles use (Vidur's NCCL measurements of the GPU's DGX node, all_reduce.py), through
NCCL's bus bandwidth: a ring all-reduce of S bytes over w GPUs moves 2(w-1)/w x S bytes
through each GPU's link, an all-gather whose output is S bytes moves (k-1)/k x S. So an
all-gather over k GPUs takes the measured all-reduce's time at the same S over the
smallest measured w >= k (the table has w = 2, 4, 8; k = 3 reads w = 4: the same NVLink
per GPU on a DGX) scaled by [(k-1)/k] / [2(w-1)/w] -- for k = w exactly half of it, as a
ring all-reduce is a reduce-scatter plus an all-gather. The layer's S is the prompt's KV
of one layer (each rank pads its stripe to the longest). Our model runs the all-gather
before the layer's attention, not overlapped with it, so the two add up; LoongServe
overlaps them on the GPU (a gain this pricing does not credit).

**Members at tp k** (a profile `<name>@tp<k>`: a group of d instances is d x k GPUs).
Rank r of each member holds heads r/k of the KV, so it exchanges its 1/k of the heads with
rank r of the other members only: k all-gathers over d GPUs each, on disjoint GPUs, side
by side. On a DGX every GPU has its own NVLink bandwidth into the NVSwitch, so the k run
in parallel at the one-gather price: one all-gather over d GPUs of a layer's KV *of one
rank's heads* -- which is what `kv_bytes_per_token` of a tp profile already is (its
shard's KV heads; 2 of the 70B's 8 at tp 4). The compute is the stripe's step on the tp
profile, with its own two all-reduces per layer among the member's ranks. A group of d x k
GPUs is assumed to share one NVSwitch node (d x k <= 8 on a DGX; not checked).
"""
from __future__ import annotations

from dataclasses import dataclass

from engines.executors.profiles.all_reduce import AllReduceTable, load_all_reduce
from policies.batch_shape import BatchShape


def all_gather_seconds(table: AllReduceTable, workers: int, num_bytes: int) -> float:
    """One all-gather over `workers` GPUs whose gathered output is `num_bytes` bytes."""
    if workers <= 1 or num_bytes <= 0:
        return 0.0
    measured = [w for w in sorted(table.curves) if w >= workers]
    if not measured:
        raise ValueError(f"{table.source}: no all-reduce times for {workers} GPUs or more "
                         f"(measured: {sorted(table.curves)})")
    w = measured[0]
    share = ((workers - 1) / workers) / (2 * (w - 1) / w)
    return table.seconds(w, num_bytes) * share


@dataclass(frozen=True)
class EspPrefillTime:
    """Seconds of one ESP prefill step, by part; the same on each of the k GPUs."""

    compute: float
    exchange: float

    @property
    def total(self) -> float:
        return self.compute + self.exchange


def stripe_shape(num_tokens: int, degree: int, begin: int = 0) -> BatchShape:
    """The one-GPU prefill chunk with a rank's stripe's tokens and attention pairs, of the
    group's chunk of positions `begin`..`num_tokens`-1: its c = ceil(n/k) of the chunk's
    n rows each see `begin` earlier keys and on average (n-1)/2 of the chunk's, so
    c*begin + n^2/(2k) pairs = the chunk c after l = begin + n(k-1)/(2k) cached."""
    n = num_tokens - begin
    rows = -(-n // degree)
    return BatchShape.of(prefills=[(rows, begin + n * (degree - 1) // (2 * degree))])


def esp_prefill_time(profile, num_tokens: int, degree: int,
                     begin: int = 0) -> EspPrefillTime:
    """A `num_tokens` prompt prefilled in one step over `degree` GPUs of `profile`'s node
    (degree 1: one GPU, the whole prompt in one step) -- or, from `begin`, one chunk of
    it: positions `begin`..`num_tokens`-1, after the earlier chunks. The exchange is what
    our model does (engines/models/sequence_parallel.py): each layer all-gathers the KV of
    every position up to the chunk's end (the earlier chunks' stripes too), so chunks pay
    the earlier positions' KV again each time."""
    compute = profile.step_time(stripe_shape(num_tokens, degree, begin), num_sampling=1)
    if degree == 1:
        return EspPrefillTime(compute, 0.0)
    if not profile.network_file:
        raise ValueError(f"esp: profile {profile.name!r} has no collective times to price "
                         f"the KV exchange")
    layers = profile.model.layers
    layer_bytes = degree * -(-num_tokens // degree) * profile.kv_bytes_per_token // layers
    exchange = layers * all_gather_seconds(load_all_reduce(profile.network_file), degree,
                                           layer_bytes)
    return EspPrefillTime(compute, exchange)

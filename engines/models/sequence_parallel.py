"""Elastic sequence parallelism (LoongServe, SOSP '24) in the model: one prompt's prefill
split over the k instances of an ESP group, and its decode continued on one of them while
the KV stays where it was made.

**Prefill (scale-up).** The prompt's positions are striped over the group: rank r computes
the query tokens at positions r, r + k, r + 2k, ... (`stripe`), so every rank's causal work
is the same to within one row. Each rank writes the K/V of its own tokens into its own
paged cache (its tokens in stripe order, slot j for its j-th token) and keeps only those.
For attention, each layer's new K/V is exchanged with **one all-gather** (K and V of a
rank's rows packed into one tensor, padded to the longest stripe); the gathered rows are
in position order after one transpose, so each rank attends its queries over the whole
prompt with a causal mask by position. We chose the all-gather over ring attention: it is
one collective per layer instead of k - 1 exchanges, it needs no online-softmax merge in
the prefill, and its bytes are the same as a ring's ((k-1)/k of the layer's KV reach each
rank either way); what it gives up is overlapping the transfer with the attention of the
shards already received, which on CPU/gloo there is nothing to overlap with anyway. A
prompt may be prefilled in chunks (the instance core bounds each rank's share of a chunk
by its step's token budget, so its own decodes get steps between chunks): a chunk's
all-gather then carries the earlier chunks' stripes again, read back from the cache --
the bytes grow with the chunk's end, the price of keeping 1/k of the KV per rank.

**Decode (scale-down).** One rank, the master, owns the decode query: it runs the model
for the new token and appends that token's K/V to its own cache. Per layer it broadcasts
the query; every holder (the master included) computes its partial attention over the KV
it holds, as (output, log-sum-exp) (`partial_attention`); the parts are gathered to the
master and merged exactly (`merge_partials`) -- LoongServe's distributed decoding; no KV
moves. The other ranks run no model layers for it: `follow_decode` is their side of one
decode step.

**The group** (`EspGroup`) is a process group of its own, formed at a store path the
members share (`EspGroup.form`), not torch.distributed's default group: ESP groups form
and dissolve among instance processes that were started independently. It is gloo (CPU
tensors); on CUDA the same store would make a `ProcessGroupNCCL` -- not built here (no GPU
on the machine this was written on).

Both steps go through the model's ordinary forward pass: the model is built with
`EspAttention` around its usual attention backend, and a step's metadata (`EspPrefill`,
`EspDecode`, or the backend's own) picks what a layer's attention does, so the layers,
norms, MLP and LM head are the ones every other step runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.nn.functional as F

from engines.models.paged_kv import gather, write_cache
from engines.models.stripes import stripe


#: How long a collective of an ESP group waits for its other members (a member that died
#: is noticed sooner, by its supervisor).
COLLECTIVE_TIMEOUT_S = 600


#: The store key each member adds 1 to when it is there (`arrived`).
_ARRIVED = "esp-arrived"


def meeting_store(store_path: str, size: int):
    """The store where a group of `size` meets: a file every member can reach, a new path
    for each group."""
    import torch.distributed as dist
    return dist.FileStore(store_path, size)


def arrive(store, chunk: int = 0) -> None:
    """Say this member is there, at the chunk of the prefill that begins at position
    `chunk` (before `EspGroup.over` for the first: see `all_arrived`)."""
    store.add(f"{_ARRIVED}-{chunk}", 1)


def all_arrived(store, size: int, chunk: int = 0) -> bool:
    """Whether every member has arrived at the chunk -- polled by a driver that must stay
    responsive while it waits, and serves its own decodes meanwhile (a member that died
    before arriving never will: its supervisor's word ends the wait, where forming the
    process group would block until its timeout)."""
    return store.add(f"{_ARRIVED}-{chunk}", 0) >= size


@dataclass(frozen=True)
class EspGroup:
    """Rank `rank` of an ESP group of `size` instances, over `backend`: a gloo process
    group of the group's own (`form`), not torch.distributed's default group -- the
    instances of a group are independent processes (each perhaps a tensor-parallel
    instance with a default group of its own), and groups form and dissolve as requests
    come and go."""

    rank: int
    size: int
    backend: object = field(repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"esp: rank {self.rank} is not in 0..{self.size - 1}")

    @classmethod
    def form(cls, store_path: str, rank: int, size: int,
             timeout_s: float = COLLECTIVE_TIMEOUT_S) -> "EspGroup":
        """Join the group that meets at `store_path` (a file every member can reach; a new
        path for each group) as `rank` of `size`; returns once all have joined."""
        return cls.over(meeting_store(store_path, size), rank, size, timeout_s)

    @classmethod
    def over(cls, store, rank: int, size: int,
             timeout_s: float = COLLECTIVE_TIMEOUT_S) -> "EspGroup":
        """As `form`, over a store already opened (`meeting_store`)."""
        import torch.distributed as dist
        return cls(rank, size, dist.ProcessGroupGloo(store, rank, size,
                                                     timedelta(seconds=timeout_s)))

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """[size, *tensor.shape]: every rank's `tensor`, in rank order."""
        out = torch.empty((self.size, *tensor.shape), dtype=tensor.dtype, device=tensor.device)
        self.backend.allgather([list(out.unbind(0))], [tensor.contiguous()]).wait()
        return out

    def broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """`tensor` as rank `src` has it, on every rank (in place)."""
        self.backend.broadcast(tensor, src).wait()
        return tensor

    def gather(self, tensor: torch.Tensor, dst: int) -> torch.Tensor | None:
        """[size, *tensor.shape] on rank `dst`, None on the others."""
        import torch.distributed as dist
        options = dist.GatherOptions()
        options.rootRank = dst
        if self.rank != dst:
            self.backend.gather([], [tensor.contiguous()], options).wait()
            return None
        out = torch.empty((self.size, *tensor.shape), dtype=tensor.dtype, device=tensor.device)
        self.backend.gather([list(out.unbind(0))], [tensor.contiguous()], options).wait()
        return out


def local_slots(block_table: list[int], begin: int, end: int, block_size: int) -> torch.Tensor:
    """The cache slots of a rank's held tokens begin..end-1 (its own numbering: the j-th
    token it holds sits at slot j of `block_table`)."""
    j = torch.arange(begin, end)
    table = torch.tensor(block_table, dtype=torch.long)
    return table[j // block_size] * block_size + j % block_size


# -- prefill ------------------------------------------------------------------------------

@dataclass
class EspPrefill:
    """One rank's metadata for an ESP prefill of a prompt's first `num_tokens` positions
    (the whole prompt, or up to the end of one chunk of it); `num_held`: the tokens of its
    stripe the chunks before computed; `slots`: where its held and new tokens' K/V go
    (`local_slots`)."""

    group: EspGroup
    num_tokens: int
    slots: torch.Tensor
    num_held: int = 0
    mask: torch.Tensor = field(init=False)  # [1, 1, rows, num_tokens]: key position <= query's
    width: int = field(init=False)          # the longest stripe: rows each rank sends

    def __post_init__(self) -> None:
        size, n = self.group.size, self.num_tokens
        if n < size:
            raise ValueError(f"esp: a prompt of {n} tokens cannot be split over {size} instances")
        queries = self.positions()
        if len(self.slots) != self.num_held + len(queries):
            raise ValueError(f"esp: {len(self.slots)} slots for {self.num_held} held and "
                             f"{len(queries)} new tokens")
        self.mask = (torch.arange(n)[None, :] <= queries[:, None])[None, None]
        self.width = -(-n // size)

    def positions(self) -> torch.Tensor:
        """This rank's query positions: its stripe's, past the `num_held` it holds."""
        size, rank = self.group.size, self.group.rank
        return torch.tensor(stripe(self.num_tokens, size, rank)[self.num_held:])

    def attend(self, q, k, v, k_cache, v_cache) -> torch.Tensor:
        """Store the chunk's new K/V, all-gather every rank's held K/V up to the chunk's
        end (the earlier chunks' stripes from the cache), attend by position."""
        held = self.num_held
        write_cache(k, v, k_cache, v_cache, self.slots[held:])
        rows, kv_heads, dim = k.shape
        own = k.new_zeros((self.width, 2, kv_heads, dim))
        if held:
            own[:held, 0] = gather(k_cache, self.slots[:held])
            own[:held, 1] = gather(v_cache, self.slots[:held])
        own[held:held + rows, 0], own[held:held + rows, 1] = k, v
        every = self.group.all_gather(own)  # [size, width, 2, ...]: rank r's i-th = i*size + r
        ordered = every.transpose(0, 1).reshape(-1, 2, kv_heads, dim)[:self.num_tokens]
        keys, values = ordered[:, 0].transpose(0, 1), ordered[:, 1].transpose(0, 1)
        out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys[None], values[None],
                                             attn_mask=self.mask, enable_gqa=True)
        return out[0].transpose(0, 1).reshape(rows, -1)


# -- decode -------------------------------------------------------------------------------

def partial_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """One query's attention over some of its context: q [heads, dim], keys/values
    [n, kv_heads, dim] (n may be 0) -> [heads, dim + 1], the output over those keys and, in
    the last column, the log-sum-exp of its scores (-inf over no keys)."""
    heads, dim = q.shape
    kv_heads = keys.shape[1]
    grouped = q.view(kv_heads, heads // kv_heads, dim)
    scores = torch.einsum("hgd,nhd->hgn", grouped, keys) / math.sqrt(dim)
    lse = torch.logsumexp(scores, dim=-1) if keys.shape[0] else \
        scores.new_full(grouped.shape[:2], float("-inf"))
    weights = torch.exp(scores - lse[..., None]) if keys.shape[0] else scores
    out = torch.einsum("hgn,nhd->hgd", weights, values)
    return torch.cat((out.reshape(heads, dim), lse.reshape(heads, 1)), dim=1)


def merge_partials(parts: torch.Tensor) -> torch.Tensor:
    """[ranks, heads, dim + 1] partial attentions over disjoint keys -> [heads, dim], the
    attention over all of them: each part weighted by exp(its lse - the largest)."""
    outs, lse = parts[..., :-1], parts[..., -1]
    weights = torch.exp(lse - lse.max(dim=0).values)  # a part over no keys: weight 0
    return (weights[..., None] * outs).sum(dim=0) / weights.sum(dim=0)[..., None]


@dataclass
class EspDecode:
    """One rank's metadata for a decode step of an ESP request: `held`, the cache slots of
    the tokens this rank holds (on the master: its new token's slot last, where the step
    writes it); `master`, the rank that owns the query."""

    group: EspGroup
    master: int
    held: torch.Tensor

    def attend(self, q, k, v, k_cache, v_cache) -> torch.Tensor:
        """The master's layer: store the new token's K/V, share the query, merge the parts."""
        write_cache(k, v, k_cache, v_cache, self.held[-1:])
        query = self.group.broadcast(q[0].contiguous(), self.master)
        parts = self.group.gather(self._part(query, k_cache, v_cache), self.master)
        return merge_partials(parts).reshape(1, -1)

    def follow(self, k_cache, v_cache, heads: int, dim: int) -> None:
        """Another holder's side of one layer: its part of the master's query."""
        query = self.group.broadcast(k_cache.new_empty((heads, dim)), self.master)
        self.group.gather(self._part(query, k_cache, v_cache), self.master)

    def _part(self, query, k_cache, v_cache) -> torch.Tensor:
        return partial_attention(query, gather(k_cache, self.held), gather(v_cache, self.held))


def follow_decode(model, kv_caches, meta: EspDecode) -> None:
    """A non-master holder's part of one decode step of the master's (every layer)."""
    attention = model.model.layers[0].self_attn
    for k_cache, v_cache in kv_caches:
        meta.follow(k_cache, v_cache, attention.num_heads, attention.head_dim)


class EspAttention:
    """An attention backend that runs ESP steps (`EspPrefill`, `EspDecode` metadata) and
    hands every other step to `inner`, the instance's usual backend."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.block_size = inner.block_size

    def build(self, seqs):
        return self.inner.build(seqs)

    def __call__(self, q, k, v, k_cache, v_cache, meta) -> torch.Tensor:
        if isinstance(meta, (EspPrefill, EspDecode)):
            return meta.attend(q, k, v, k_cache, v_cache)
        return self.inner(q, k, v, k_cache, v_cache, meta)

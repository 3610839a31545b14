"""One rank's part of one ESP request: the blocks of its paged cache that hold the KV of
the tokens it computed, and the steps it takes part in (engines/models/sequence_parallel.py
has the attention): the striped prefill, then each decode step as the master (it runs the
model for the new token) or as a holder that only lends its KV (`follow`).

The held tokens are numbered in the order the rank computed them (its stripe of the
prompt, then, on the master, each decoded token), slot j of `block_table` for the j-th:
the cache needs ceil(held / block_size) blocks on this rank, about 1/k of the prompt's.
"""
from __future__ import annotations

import torch

from engines.models.paged_kv import gather, write_cache
from engines.models.sequence_parallel import (EspDecode, EspGroup, EspPrefill, follow_decode,
                                              local_slots)
from engines.models.stripes import stripe_len


class EspSequence:
    """`group`: this rank's place in the request's ESP group; `block_table`: the blocks of
    this rank's cache given to the request (enough for what it will hold)."""

    def __init__(self, group: EspGroup, block_table: list[int], block_size: int) -> None:
        self.group = group
        self.block_table = list(block_table)
        self.block_size = block_size
        self.held = 0         # tokens whose KV this rank holds
        self.num_tokens = 0   # tokens of the request computed so far (every rank's)

    def _slots(self, begin: int, end: int) -> torch.Tensor:
        if -(-end // self.block_size) > len(self.block_table):
            raise ValueError(f"esp: {end} held tokens do not fit {len(self.block_table)} blocks "
                             f"of {self.block_size}")
        return local_slots(self.block_table, begin, end, self.block_size)

    @torch.inference_mode()
    def prefill(self, model, kv_caches, token_ids: list[int], begin: int = 0,
                end: int | None = None) -> torch.Tensor | None:
        """This rank's stripe of the prompt `token_ids` -- or of one chunk of it, positions
        `begin`..`end`-1, after the chunks before it (the group's chunked prefill); the
        prompt's next-token logits [vocab] on the rank that computed its last token, None
        on the others (and for a chunk that does not end the prompt)."""
        n, size, rank = len(token_ids), self.group.size, self.group.rank
        end = n if end is None else end
        if self.num_tokens != begin or self.held != stripe_len(begin, size, rank):
            raise ValueError(f"esp: a chunk from {begin} after {self.num_tokens} tokens")
        held = stripe_len(end, size, rank)
        meta = EspPrefill(self.group, end, self._slots(0, held), num_held=self.held)
        positions = meta.positions()
        ids = torch.tensor(token_ids, dtype=torch.long)[positions]
        last = end == n and (n - 1) % size == rank
        rows = torch.tensor([len(positions) - 1] if last else [], dtype=torch.long)
        logits = model(ids, positions, kv_caches, meta, rows)
        self.held, self.num_tokens = held, end
        return logits[0] if last else None

    @torch.inference_mode()
    def decode(self, model, kv_caches, token_id: int, master: int) -> torch.Tensor | None:
        """One decode step of token `token_id` (at the next position) with `master` owning
        the query: its next-token logits [vocab] on the master, None on the others."""
        position = self.num_tokens
        self.num_tokens += 1
        if self.group.rank != master:
            follow_decode(model, kv_caches, EspDecode(self.group, master, self._slots(0, self.held)))
            return None
        meta = EspDecode(self.group, master, self._slots(0, self.held + 1))
        self.held += 1
        logits = model(torch.tensor([token_id]), torch.tensor([position]), kv_caches, meta,
                       torch.tensor([0]))
        return logits[0]

    @torch.inference_mode()
    def gather_to(self, kv_caches, master: int, block_table: list[int] | None) -> None:
        """Scale down by moving the KV instead (the live path's choice,
        docs/elastic_sequence_parallelism.md): right after the prefill, every rank's stripe
        goes to `master` (one gather per layer), which writes the prompt's KV into
        `block_table` (its blocks for the whole prompt, position p at slot p) -- from then
        on it decodes the request as any other, and the others may free their stripes.
        `block_table`: the master's; None on the others."""
        n, size, rank = self.num_tokens, self.group.size, self.group.rank
        if self.held != stripe_len(n, size, rank):
            raise ValueError("esp: the KV moves to the master right after the prefill only")
        width = -(-n // size)
        own = self._slots(0, self.held)
        positions = torch.arange(n)
        if rank == master:
            if -(-n // self.block_size) > len(block_table):
                raise ValueError(f"esp: {n} tokens do not fit {len(block_table)} blocks")
            table = torch.tensor(block_table, dtype=torch.long)
            slots = table[positions // self.block_size] * self.block_size + \
                positions % self.block_size
        for k_cache, v_cache in kv_caches:
            packed = k_cache.new_zeros((width, 2, *k_cache.shape[2:]))
            packed[:self.held, 0] = gather(k_cache, own)
            packed[:self.held, 1] = gather(v_cache, own)
            parts = self.group.gather(packed, master)
            if parts is not None:   # rank r's i-th row is position i * size + r
                ordered = parts.transpose(0, 1).reshape(-1, *packed.shape[1:])[:n]
                write_cache(ordered[:, 0], ordered[:, 1], k_cache, v_cache, slots)

"""Paged KV cache bookkeeping: fixed-size blocks, per-request block tables, and automatic
prefix caching.

This only hands out block numbers; the executor owns the tensors they index.

With `prefix_caching`, every full block a request computes is named by the hash of its
tokens chained on its prefix (`policies.prefix_hash`) and stays findable by that name:
blocks have reference counts, a block no request holds any more is *cached free* --
counted as free, reused only when no never-used block is left, least recently released
first (LRU) -- and a request that arrives with a prefix whose blocks are cached takes
them instead of computing them again. Only full blocks are shared, so a block is written
by one request only, before it has a name.

A waiting request carries a *hint* (`match_prefix`): the cached blocks its prompt starts
with (`Request.prefix_hit`) and, as `num_computed_tokens`, their tokens -- what the
scheduler's policies price it by. It holds nothing until admission, when `claim_prefix`
looks again and takes what is there then (reference counts up); `allocate` then adds the
blocks its new tokens need. The last token is never taken from the cache: a step must
compute at least one token of the request to have its logits.

In a multiplexed instance (engines/mux_core.py) each model's manager draws on one
`KvPool` shared by every model (engines/kv_pool.py): a block some request holds takes
`block_units` of the pool's units, so a model's free blocks are what the pool has left,
in its blocks.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from engines.kv_pool import KvPool
from engines.request import Request
from policies.prefix_hash import block_hashes, chained_hash, extend_block_hashes


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


@dataclass
class PrefixCacheStats:
    """Admissions' lookups since the start: blocks and tokens asked for and found."""

    queried_blocks: int = 0   # full blocks a request could have found (all but its last token)
    hit_blocks: int = 0
    queried_tokens: int = 0   # tokens of the requests admitted
    hit_tokens: int = 0
    evictions: int = 0        # cached blocks given to other content


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int = 16, *,
                 prefix_caching: bool = False, pool: KvPool | None = None,
                 model: str = "", block_units: int = 1) -> None:
        """`pool` (a multiplexed instance's): held blocks take `block_units` units each
        from it, counted as `model`'s; `num_blocks` is then the most it could hold."""
        if num_blocks < 1:
            raise ValueError(f"num_kv_blocks must be at least 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.stats = PrefixCacheStats()
        self._empty: deque[int] = deque(range(num_blocks))  # free, holding no named content
        self._evictable: OrderedDict[int, None] = OrderedDict()  # free but named: LRU first
        self._refs = [0] * num_blocks
        self._name: list[bytes | None] = [None] * num_blocks
        self._by_name: dict[bytes, int] = {}
        self.pool, self.model, self.block_units = pool, model, block_units

    # ---- counts ----------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds: never used, or cached free (reusable on demand); in a
        shared pool, no more than its free units make."""
        if self.pool is not None:
            return min(len(self._empty) + len(self._evictable),
                       self.pool.free_units // self.block_units)
        return len(self._empty) + len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks findable by name (held or cached free)."""
        return len(self._by_name)

    @property
    def usage(self) -> float:
        """Share of blocks in use, 0..1."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        """Blocks `request` must gain so `num_new_tokens` more tokens fit after the cached ones
        (a request waiting on a prefix hint holds none: counted from its first token)."""
        held = 0 if self._hinted(request) else request.num_computed_tokens
        return max(0, -(-(held + num_new_tokens) // self.block_size) - len(request.block_table))

    def admission_blocks(self, request: Request, num_new_tokens: int) -> int:
        """Free blocks admitting `request` with `num_new_tokens` new tokens takes: those of
        its new tokens, and the cached free blocks of its prefix hit (they stop being free)."""
        if not self._hinted(request):
            return self.blocks_needed(request, num_new_tokens)
        hit = request.prefix_hit
        total = -(-(request.num_computed_tokens + num_new_tokens) // self.block_size)
        refs = self._refs
        return max(0, total - len(hit)) + sum(1 for block in hit if refs[block] == 0)

    def can_allocate(self, request: Request, num_new_tokens: int) -> bool:
        return self.blocks_needed(request, num_new_tokens) <= self.num_free_blocks

    # ---- holding blocks --------------------------------------------------------------------
    def allocate(self, request: Request, num_new_tokens: int) -> bool:
        """Grow the block table for `num_new_tokens` more tokens; False (and no change) if short.
        A request waiting on a prefix hint drops it first (`claim_prefix` takes one)."""
        table, block_size = request.block_table, self.block_size
        if table and num_new_tokens == 1 and request.num_computed_tokens == len(table) * block_size:
            # A decode whose next token opens a new block (each decode, every block-size
            # steps: the commonest call by far): exactly one block, and no hint to drop.
            if not (self._empty or self._evictable) or (
                    self.pool is not None and self.pool.free_units < self.block_units):
                return False
            table.append(self._take())
            return True
        need = self.blocks_needed(request, num_new_tokens)
        if need > self.num_free_blocks:
            return False
        if self._hinted(request):
            request.prefix_hit, request.num_computed_tokens = [], 0
        table += self._take_many(need)
        return True

    def free(self, request: Request) -> None:
        """Release the request's blocks, its last block first: a named block stays cached
        free, and the end of a prefix is reused before its start (which more requests share)."""
        refs, names, empty, evictable = self._refs, self._name, self._empty.append, self._evictable
        for block in reversed(request.block_table):
            left = refs[block] = refs[block] - 1
            if not left:
                if names[block] is None:
                    empty(block)
                else:
                    evictable[block] = None
                if self.pool is not None:
                    self.pool.give_back(self.model, self.block_units)
        request.block_table = []
        request.prefix_hit = []
        request.num_named_blocks = 0

    def _take_many(self, n: int) -> list[int]:
        """`_take` of `n` blocks, in bulk: never-used ones first, then the least recently
        freed cached ones (a long prompt's blocks, once the never-used ones run out)."""
        empty, refs = self._empty, self._refs
        take = empty.popleft
        blocks = [take() for _ in range(min(n, len(empty)))]
        evicted = n - len(blocks)
        if evicted:
            evict, names, by_name = self._evictable.popitem, self._name, self._by_name
            for _ in range(evicted):
                block, _ = evict(last=False)
                del by_name[names[block]]
                names[block] = None
                blocks.append(block)
            self.stats.evictions += evicted
        for block in blocks:
            refs[block] = 1
        if self.pool is not None:
            self.pool.take(self.model, n * self.block_units)
        return blocks

    def _take(self) -> int:
        """A free block for new content: a never-used one, else the least recently freed
        cached one (its name forgotten)."""
        if self._empty:
            block = self._empty.popleft()
        else:
            block, _ = self._evictable.popitem(last=False)
            del self._by_name[self._name[block]]
            self._name[block] = None
            self.stats.evictions += 1
        self._refs[block] = 1
        if self.pool is not None:
            self.pool.take(self.model, self.block_units)
        return block

    # ---- the prefix cache ------------------------------------------------------------------
    def match_prefix(self, request: Request) -> int:
        """Set a request that holds no blocks to wait on a hint: the cached blocks its tokens
        start with (all but its last token). Returns the tokens found; changes no block."""
        if request.block_table:
            raise ValueError(f"{request!r} holds blocks: it has no prefix to look up")
        hit = self._lookup(request) if self.prefix_caching else []
        request.prefix_hit = hit
        request.num_computed_tokens = len(hit) * self.block_size
        return request.num_computed_tokens

    def claim_prefix(self, request: Request) -> int:
        """Admission: look the request's prefix up again and hold the blocks found (the
        request then holds them and counts their tokens as computed). Returns those tokens.
        Its first admission's answer is kept as `num_cached_tokens`."""
        self.match_prefix(request)
        refs, evictable = self._refs, self._evictable
        for block in request.prefix_hit:
            if refs[block] == 0:
                del evictable[block]
                if self.pool is not None:  # may overdraw it: the scheduler then gives it back
                    self.pool.take(self.model, self.block_units)
            refs[block] += 1
        request.block_table = list(request.prefix_hit)
        request.num_named_blocks = len(request.prefix_hit)
        request.prefix_hit = []
        hit = request.num_computed_tokens
        stats = self.stats
        stats.queried_blocks += (request.num_tokens - 1) // self.block_size
        stats.hit_blocks += hit // self.block_size
        stats.queried_tokens += request.num_tokens
        stats.hit_tokens += hit
        if request.num_cached_tokens is None:
            request.num_cached_tokens = hit
        return hit

    def name_full_blocks(self, request: Request) -> None:
        """Name the blocks the request has filled since it last did (after a step), so later
        requests find them. A block whose content another block already holds stays unnamed."""
        if not self.prefix_caching:
            return
        block_size = self.block_size
        full = request.num_computed_tokens // block_size
        named = request.num_named_blocks
        if full <= named:
            return
        hashes = request.block_hashes
        if full == named + 1 == len(hashes) + 1 and hashes:
            # A decode filled one block (the commonest call): its name, chained on the last
            hashes.append(chained_hash(hashes[-1], request.token_ids[named * block_size:
                                                                     full * block_size]))
        else:
            extend_block_hashes(hashes, request.token_ids, block_size, limit=full)
        names, by_name, table = self._name, self._by_name, request.block_table
        for i in range(request.num_named_blocks, full):
            block, name = table[i], hashes[i]
            if names[block] is None and name not in by_name:
                names[block] = name
                by_name[name] = block
        request.num_named_blocks = full

    def _lookup(self, request: Request) -> list[int]:
        """The cached blocks the request's tokens start with, all but its last token's."""
        most = (request.num_tokens - 1) // self.block_size
        if not request.block_hashes:  # named once, maybe already (`block_hashes`)
            request.block_hashes = block_hashes(request.prompt_token_ids, self.block_size)
        hashes = extend_block_hashes(request.block_hashes, request.token_ids, self.block_size,
                                     limit=most)
        by_name, hit = self._by_name, []
        for name in hashes[:most]:
            block = by_name.get(name)
            if block is None:
                break
            hit.append(block)
        return hit

    @staticmethod
    def _hinted(request: Request) -> bool:
        return bool(request.prefix_hit) and not request.block_table

    def check(self) -> None:
        """Raise AssertionError unless the bookkeeping is consistent (for tests)."""
        free = set(self._empty) | set(self._evictable)
        assert len(free) == len(self._empty) + len(self._evictable), "a block is free twice"
        for block in range(self.num_blocks):
            assert (self._refs[block] == 0) == (block in free), f"block {block}: refs vs free"
            name = self._name[block]
            assert (block in self._evictable) <= (name is not None), f"block {block} unnamed"
            assert name is None or self._by_name[name] == block, f"block {block}: name map"
        assert len(self._by_name) == sum(n is not None for n in self._name)

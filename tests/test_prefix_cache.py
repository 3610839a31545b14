"""Automatic prefix caching in the paged KV cache (engines/kv_cache.py): what a request
finds is exactly what an earlier one computed, blocks are shared by reference, cached
free blocks are reused least recently used first and only when memory is needed, and no
block ever leaks.

Covers: engines/kv_cache.py.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engines.kv_cache import BlockManager
from engines.request import Request
from ipc.params import SamplingParams
from policies.prefix_hash import ROOT, block_hash, block_hashes, extend_block_hashes
from tests.examples import examples

BS = 4
PARAMS = SamplingParams(max_tokens=8)


def request(name: str, tokens: list[int]) -> Request:
    return Request(name, tokens, PARAMS)


def run_prompt(kv: BlockManager, r: Request) -> int:
    """Admit `r` as the scheduler does and compute its whole prompt; returns the hit."""
    kv.match_prefix(r)
    hit = kv.claim_prefix(r)
    assert kv.allocate(r, r.num_uncomputed_tokens)
    r.num_computed_tokens = r.num_tokens
    kv.name_full_blocks(r)
    return hit


def test_a_shared_prefix_is_found_and_shared_by_reference():
    kv = BlockManager(16, BS, prefix_caching=True)
    a = request("a", list(range(10)))                 # blocks [0-3] [4-7] and 2 tokens
    assert run_prompt(kv, a) == 0
    b = request("b", list(range(8)) + [99, 98, 97])   # the same two full blocks, then other
    assert kv.match_prefix(b) == 8 and b.num_uncomputed_tokens == 3
    assert run_prompt(kv, b) == 8
    assert b.block_table[:2] == a.block_table[:2]     # the same blocks, not copies
    assert b.block_table[2] != a.block_table[2]
    kv.free(a)
    assert kv.num_free_blocks == 16 - 3               # the shared two are still held by b
    kv.free(b)
    assert kv.num_free_blocks == 16
    kv.check()


def test_the_last_token_is_always_computed():
    kv = BlockManager(16, BS, prefix_caching=True)
    run_prompt(kv, request("a", list(range(8))))
    again = request("b", list(range(8)))
    assert kv.match_prefix(again) == 4   # not 8: a step must compute a token for its logits
    assert again.num_uncomputed_tokens == 4


def test_a_different_prefix_finds_nothing_even_with_equal_later_blocks():
    kv = BlockManager(16, BS, prefix_caching=True)
    run_prompt(kv, request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    assert kv.match_prefix(request("b", [0, 2, 3, 4, 5, 6, 7, 8, 9])) == 0


def test_blocks_are_named_as_decoding_fills_them():
    kv = BlockManager(16, BS, prefix_caching=True)
    a = request("a", [1, 2, 3])
    run_prompt(kv, a)
    for token in (4, 5, 6):          # decode: each new token is computed at the next step
        assert kv.allocate(a, 1)
        a.token_ids.append(token)
        a.num_computed_tokens += 1
        kv.name_full_blocks(a)
    kv.free(a)
    assert kv.match_prefix(request("b", [1, 2, 3, 4, 5, 6])) == 4


def test_cached_blocks_are_reused_only_when_no_empty_block_is_left_oldest_first():
    kv = BlockManager(4, BS, prefix_caching=True)
    old, new = request("old", list(range(5))), request("new", list(range(100, 105)))
    run_prompt(kv, old)
    run_prompt(kv, new)
    kv.free(old)
    kv.free(new)
    assert kv.num_free_blocks == 4 and kv.num_cached_blocks == 2
    filler = request("filler", list(range(200, 208)))  # two blocks: the two empty ones
    run_prompt(kv, filler)
    assert kv.num_cached_blocks == 4 and kv.stats.evictions == 0
    assert kv.match_prefix(request("x", list(range(5)))) == 4
    extra = request("extra", list(range(300, 303)))
    run_prompt(kv, extra)            # one block: the least recently freed cached one
    assert kv.stats.evictions == 1
    assert kv.match_prefix(request("x", list(range(5)))) == 0
    assert kv.match_prefix(request("y", list(range(100, 105)))) == 4
    kv.check()


def test_a_hint_is_admission_priced_and_dropped_by_a_plain_allocate():
    kv = BlockManager(8, BS, prefix_caching=True)
    a = request("a", list(range(9)))
    run_prompt(kv, a)
    kv.free(a)
    b = request("b", list(range(9)))
    kv.match_prefix(b)                    # hint: 2 cached free blocks
    assert kv.admission_blocks(b, 1) == 3  # the new token's block + the 2 taken off the free list
    assert kv.blocks_needed(b, 9) == 3    # holding nothing, a plain allocation starts at 0
    assert kv.allocate(b, 9) and b.num_computed_tokens == 0 and len(b.block_table) == 3
    kv.free(b)
    kv.check()


def test_a_decode_past_a_full_table_takes_one_block_reusing_a_cached_one_or_nothing():
    kv = BlockManager(3, BS, prefix_caching=True)
    a = request("a", list(range(8)))          # two full blocks, then it decodes
    run_prompt(kv, a)
    assert kv.allocate(a, 1) and len(a.block_table) == 3 and kv.num_free_blocks == 0
    a.num_computed_tokens = 12                # the third block full too: none is left
    assert not kv.allocate(a, 1) and len(a.block_table) == 3
    b = request("b", list(range(100, 108)))
    kv.free(a)                    # a's two named blocks cached free, its third empty
    run_prompt(kv, b)             # the empty block, then the oldest cached one
    b.token_ids.append(7)
    assert kv.allocate(b, 1) and len(b.block_table) == 3  # the last cached one, reused
    assert kv.stats.evictions == 2 and kv.num_free_blocks == 0
    kv.check()


def test_without_prefix_caching_nothing_is_named_or_found():
    kv = BlockManager(8, BS, prefix_caching=False)
    run_prompt(kv, request("a", list(range(9))))
    assert kv.num_cached_blocks == 0
    assert kv.match_prefix(request("b", list(range(9)))) == 0


def test_requests_without_hashes_allocate_and_free_as_before():
    kv = BlockManager(4, BS, prefix_caching=True)
    r = request("a", list(range(6)))
    assert kv.can_allocate(r, 6) and kv.allocate(r, 6) and len(r.block_table) == 2
    assert not kv.allocate(r, 100) and len(r.block_table) == 2
    kv.free(r)
    assert kv.num_free_blocks == 4


def test_block_names_chain_on_the_prefix():
    assert block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)[1] != block_hashes([0, 0, 0, 0, 5, 6, 7, 8], 4)[1]
    assert block_hashes([1, 2, 3, 4, 5], 4) == block_hashes([1, 2, 3, 4, 6], 4)


def _names_block_by_block(tokens: list[int], block_size: int) -> list[bytes]:
    """The names as they were made before: one `block_hash` per block, chained."""
    names, parent = [], ROOT
    for i in range(len(tokens) // block_size):
        parent = block_hash(parent, tokens[i * block_size:(i + 1) * block_size])
        names.append(parent)
    return names


@given(st.lists(st.integers(0, 2**63 - 1), max_size=40), st.integers(1, 8), st.integers(0, 6))
def test_shared_and_extended_names_equal_the_block_by_block_ones(tokens, block_size, known):
    """One conversion of the tokens to bytes (and a prompt named once, then looked up)
    names every block as one `block_hash` per block did."""
    expected = _names_block_by_block(tokens, block_size)
    assert block_hashes(tokens, block_size) == expected
    assert block_hashes(list(tokens), block_size) == expected  # the kept names, a new list
    start = expected[:known]
    assert extend_block_hashes(list(start), tokens, block_size) == expected
    assert extend_block_hashes(list(start), tokens, block_size, limit=3) == expected[:max(3, known)]


def test_a_looked_up_prompt_gives_its_own_list():
    """The kept names are never handed out to be extended in place."""
    first = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    first.append(b"changed")
    assert block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4) == _names_block_by_block(list(range(1, 9)), 4)


def test_a_token_past_64_bits_is_refused_as_before():
    with pytest.raises(OverflowError):
        block_hashes([2**64], 1)


def test_an_instance_finds_the_names_the_controller_made():
    """The kv cache's lookup names a prompt as the controller does (`block_hashes`)."""
    kv = BlockManager(16, BS, prefix_caching=True)
    r = request("a", list(range(11)))
    kv.match_prefix(r)
    assert r.block_hashes[:2] == block_hashes(list(range(11)), BS)[:2]
    assert r.block_hashes == _names_block_by_block(list(range(11)), BS)


# ---- random sequences of admissions, growth and releases -----------------------------------

PREFIXES = [[7] * 6, [7] * 4 + [8, 8], [1, 2, 3, 4, 5, 6, 7, 8]]


class PrefixCacheMachine(RuleBasedStateMachine):
    """The cache against a model of what every block holds: a block a request finds holds
    exactly the tokens the request has there, and free + held = all blocks, always."""

    def __init__(self) -> None:
        super().__init__()
        self.kv = BlockManager(12, BS, prefix_caching=True)
        self.live: list[Request] = []
        self.content: dict[int, list[int]] = {}   # block -> the tokens written into it
        self.count = 0

    def _write(self, r: Request, start: int, end: int) -> None:
        for position in range(start, end):
            block = r.block_table[position // BS]
            slot = self.content.setdefault(block, [None] * BS)
            slot[position % BS] = r.token_ids[position]

    @rule(prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(0, 3), max_size=9))
    def admit(self, prefix, tail):
        r = request(f"r{self.count}", prefix + tail or [0])
        self.count += 1
        self.kv.match_prefix(r)
        hint = r.num_computed_tokens
        hit = self.kv.claim_prefix(r)
        assert hit == hint  # nothing changed in between
        for position in range(hit):   # what it found is what it has: the KV is right
            assert self.content[r.block_table[position // BS]][position % BS] == r.token_ids[position]
        if not self.kv.allocate(r, r.num_uncomputed_tokens):
            self.kv.free(r)
            return
        self._write(r, hit, r.num_tokens)
        r.num_computed_tokens = r.num_tokens
        self.kv.name_full_blocks(r)
        self.live.append(r)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100), token=st.integers(0, 3))
    def grow(self, pick, token):
        r = self.live[pick % len(self.live)]
        r.token_ids.append(token)
        if not self.kv.allocate(r, 1):
            r.token_ids.pop()
            return
        self._write(r, r.num_computed_tokens, r.num_tokens)
        r.num_computed_tokens += 1
        self.kv.name_full_blocks(r)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100))
    def release(self, pick):
        self.kv.free(self.live.pop(pick % len(self.live)))

    @invariant()
    def consistent(self):
        self.kv.check()
        held = [b for r in self.live for b in r.block_table]
        assert self.kv.num_free_blocks + len(set(held)) == self.kv.num_blocks
        for block in set(held):
            assert self.kv._refs[block] == held.count(block)

    def teardown(self):
        for r in self.live:
            self.kv.free(r)
        assert self.kv.num_free_blocks == self.kv.num_blocks, "KV blocks leaked"


TestPrefixCacheMachine = PrefixCacheMachine.TestCase
TestPrefixCacheMachine.settings = settings(max_examples=examples(150), stateful_step_count=40,
                                           deadline=None)


@pytest.mark.parametrize("caching", [True, False])
def test_free_block_count_returns_to_the_start(caching):
    kv = BlockManager(10, BS, prefix_caching=caching)
    requests = [request(f"r{i}", [5] * (3 + 4 * i)) for i in range(3)]
    for r in requests:
        run_prompt(kv, r)
    for r in requests:
        kv.free(r)
    assert kv.num_free_blocks == kv.num_blocks
    kv.check()

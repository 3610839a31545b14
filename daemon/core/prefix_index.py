"""The controller's approximate map of the prompt prefixes each instance holds in its
prefix cache: the names of the full blocks (policies/prefix_hash.py) of every prompt it
sent there, and of every request completed there with its output, least recently sent
forgotten first once an instance's count passes its KV blocks (llm-d's approximate
prefix-cache scorer: no message from the instances, only what the controller routed).

It answers one question, for routing and the HP gate: how many prompt tokens of a
request each instance would find cached. A new request's prompt is named block by block
when it arrives and looked up (`look_up`): routing (`policies.routing.prefix_aware`, the
waiting room's `Waiting.cost_on`) and the HP gate then count only the tokens an instance
would still have to compute. The core tells it every Submit (`record`: the prompt's
blocks, for its instance) and every completed request (`completed`: its output's too; a
conversation's next turn starts with both). What an instance actually found arrives with
the step that admitted the request (`StepOutputs.cached`, `Ledger.found_cached`) and ends
up in its `Settle` (OpenAI's `usage.prompt_tokens_details.cached_tokens`). Sans-I/O; one
of the controller core's components (daemon/core/controller_core.py).
"""
from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence

from ipc.messages import Ready
from policies.prefix_hash import block_hashes, extend_block_hashes


#: Stale places `_Held.calls` may list beyond twice the names held before it is compacted.
COMPACT_SLACK = 1024


class _Held:
    """One instance's block names, least recently recorded forgotten first once there
    are more than `capacity`: an LRU kept by stamps, not by moving each name.

    `stamps` maps each name held to the `record` call that last named it; `calls` keeps
    each call's names in order, oldest call first. A name is forgotten at its place in
    the oldest call still listed, unless a later call named it again (its stamp then
    says so, and that place is stale). So a record is one dict update in C, and the
    order forgotten is exactly a move-to-end LRU's: by last call, then place in it. (The
    names of one call are distinct, as a chain of block names is.)"""

    __slots__ = ("capacity", "stamps", "calls", "_seq", "_listed")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.stamps: dict[bytes, int] = {}
        self.calls: deque[list] = deque()   # [stamp, names, next place to forget]
        self._seq = 0
        self._listed = 0                     # names in `calls` from their next places on

    def record(self, names: Sequence[bytes]) -> None:
        self._seq += 1
        names = tuple(names)
        self.stamps.update(zip(names, itertools.repeat(self._seq)))
        self.calls.append([self._seq, names, 0])
        self._listed += len(names)
        self._forget(len(self.stamps) - self.capacity)
        if self._listed > 2 * len(self.stamps) + COMPACT_SLACK:
            self._compact()

    def _forget(self, n: int) -> None:
        """Forget the `n` least recently recorded names."""
        stamps, calls = self.stamps, self.calls
        while n > 0:
            call = calls[0]
            seq, names, start = call
            place = start
            for name in itertools.islice(names, start, None):
                place += 1
                if stamps.get(name) == seq:
                    del stamps[name]
                    n -= 1
                    if not n:
                        break
            self._listed -= place - start
            call[2] = place
            if place == len(names):
                calls.popleft()

    def _compact(self) -> None:
        """Drop the stale places (names recorded again since), so `calls` stays within a
        small multiple of what is held however long the process runs."""
        stamps, kept = self.stamps, deque()
        for seq, names, place in self.calls:
            live = tuple(name for name in names[place:] if stamps.get(name) == seq)
            if live:
                kept.append([seq, live, 0])
        self.calls = kept
        self._listed = sum(len(names) for _, names, _ in kept)


class PrefixIndex:
    def __init__(self) -> None:
        self.block_size: int | None = None
        self._held: dict[int, _Held] = {}

    @property
    def active(self) -> bool:
        """Some instance caches prefixes (the others are never asked about)."""
        return bool(self._held)

    def ready(self, ready: Ready) -> None:
        """An instance serves (again, after a restart: with nothing cached)."""
        self._held.pop(ready.instance_id, None)
        if not ready.prefix_caching:
            return
        if self.block_size is None:
            self.block_size = ready.block_size
        if ready.block_size == self.block_size:  # one block size names blocks alike
            self._held[ready.instance_id] = _Held(ready.num_kv_blocks)

    def look_up(self, prompt: Sequence[int]) -> tuple[list[bytes], dict[int, int]]:
        """A new prompt's block names, and the prompt tokens each instance would find."""
        if not self.active:
            return [], {}
        names = self.names(prompt)
        return names, self.cached_tokens(names, len(prompt))

    def completed(self, instance_id: int, names: list[bytes], prompt: list[int],
                  output: list[int]) -> None:
        """A request completed on `instance_id`, its prompt's blocks named `names`: the
        instance keeps its prompt and output blocks (until it needs the memory), all but
        the last token's, which no step computed."""
        if self.active:
            self.record(instance_id, self.extended(names, prompt + output[:-1]))

    def names(self, token_ids: Sequence[int]) -> list[bytes]:
        """The names of the full blocks of `token_ids` ([] when no instance caches)."""
        return block_hashes(token_ids, self.block_size) if self.active else []

    def extended(self, names: list[bytes], token_ids: Sequence[int]) -> list[bytes]:
        """`names` (of a prefix of `token_ids`) and those of the rest of its full blocks."""
        return extend_block_hashes(list(names), token_ids, self.block_size) if self.active else []

    def record(self, instance_id: int, names: Sequence[bytes]) -> None:
        """The instance will hold these blocks (it was sent or has finished their request):
        each becomes the most recent, in order; past its KV blocks the least recent go."""
        held = self._held.get(instance_id)
        if held is not None:
            held.record(names)

    def cached_tokens(self, names: Sequence[bytes], num_tokens: int) -> dict[int, int]:
        """Prompt tokens of a request of `num_tokens` tokens whose block names are `names`
        each caching instance would find (never its last token), where more than none."""
        if not self.active:
            return {}
        most = min(len(names), (num_tokens - 1) // self.block_size)
        found = {}
        for instance_id, held in self._held.items():
            stamps, n = held.stamps, 0
            while n < most and names[n] in stamps:
                n += 1
            if n:
                found[instance_id] = n * self.block_size
        return found

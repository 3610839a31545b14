"""The controller's approximate map of the prompt prefixes each instance holds in its
prefix cache: the names of the full blocks (policies/prefix_hash.py) of every prompt it
sent there, and of every request completed there with its output, least recently sent
forgotten first once an instance's count passes its KV blocks (llm-d's approximate
prefix-cache scorer: no message from the instances, only what the controller routed).

It answers one question, for routing and the HP gate: how many prompt tokens of a
request each instance would find cached. Sans-I/O; the core's prefixes component
(daemon/core/prefixes.py) owns it.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from ipc.messages import Ready
from policies.prefix_hash import block_hashes, extend_block_hashes


class PrefixIndex:
    def __init__(self) -> None:
        self.block_size: int | None = None
        self._held: dict[int, OrderedDict[bytes, None]] = {}
        self._capacity: dict[int, int] = {}

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
            self._held[ready.instance_id] = OrderedDict()
            self._capacity[ready.instance_id] = ready.num_kv_blocks

    def names(self, token_ids: Sequence[int]) -> list[bytes]:
        """The names of the full blocks of `token_ids` ([] when no instance caches)."""
        return block_hashes(token_ids, self.block_size) if self.active else []

    def extended(self, names: list[bytes], token_ids: Sequence[int]) -> list[bytes]:
        """`names` (of a prefix of `token_ids`) and those of the rest of its full blocks."""
        return extend_block_hashes(list(names), token_ids, self.block_size) if self.active else []

    def record(self, instance_id: int, names: Iterable[bytes]) -> None:
        """The instance will hold these blocks (it was sent or has finished their request)."""
        held = self._held.get(instance_id)
        if held is None:
            return
        move_to_end = held.move_to_end
        for name in names:  # each to the end, in order (a new one is added there)
            if name in held:
                move_to_end(name)
            else:
                held[name] = None
        evict = held.popitem
        for _ in range(len(held) - self._capacity[instance_id]):  # the least recent go
            evict(last=False)

    def cached_tokens(self, names: Sequence[bytes], num_tokens: int) -> dict[int, int]:
        """Prompt tokens of a request of `num_tokens` tokens whose block names are `names`
        each caching instance would find (never its last token), where more than none."""
        if not self.active:
            return {}
        most = min(len(names), (num_tokens - 1) // self.block_size)
        found = {}
        for instance_id, held in self._held.items():
            n = 0
            while n < most and names[n] in held:
                n += 1
            if n:
                found[instance_id] = n * self.block_size
        return found

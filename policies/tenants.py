"""Tenants' fair shares: who has had how much of the box (docs/design.md §5.11).

A request's tenant is who sent it (the gateway's fairness id, the body's `user`, else
DEFAULT_TENANT). Under saturation -- when the waiting room's triage must set requests
aside -- the tenants with requests in the box share service by weight, as the Virtual
Token Counter does (Sheng et al., "Fairness in Serving Large Language Models", OSDI
2024): each tenant's counter adds the tokens computed for it (prompt and output) over
its weight; the triage keeps the requests of the tenants with the lowest counters and
sets aside those of the one furthest over its share (policies/global_queue.py). A
tenant that had nothing in the box starts at the least counter of those that had (VTC's
lift), so idling banks no credit and a newcomer cannot take the box for a while.

Counting starts with the second tenant: with one tenant there is nothing to share, and
the hot path (one call per token) stays as it was. Pure and clock-free: the controller
core tells it what arrived, what was computed and what ended.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

DEFAULT_TENANT = "default"
#: Counters of tenants out of the box are pruned once there are this many more of them
#: than twice the tenants in it.
FORGET_AFTER = 64


@dataclass
class TenantShares:
    """Each tenant's virtual token counter and its requests in the box."""
    weights: Mapping[str, float] = field(default_factory=dict)   # not named: 1
    counters: dict[str, float] = field(default_factory=dict)
    live: dict[str, int] = field(default_factory=dict)           # requests in the box
    #: A second tenant has been seen: counters count from then on.
    counting: bool = False

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def arrived(self, tenant: str) -> None:
        """A new request of `tenant`; lifted to the least counter in the box if it had
        nothing there."""
        live = self.live
        if not live.get(tenant):
            if not self.counting and live and tenant not in live:
                self.counting = True
            least = min((self.counters.get(t, 0.0) for t in live), default=0.0)
            self.counters[tenant] = max(self.counters.get(tenant, 0.0), least)
        live[tenant] = live.get(tenant, 0) + 1

    def computed(self, tenant: str, tokens: int) -> None:
        """`tokens` more computed for `tenant` (a prompt's uncached part, or one output)."""
        if self.counting:
            self.counters[tenant] = self.counters.get(tenant, 0.0) + tokens / self.weight(tenant)

    def ended(self, tenant: str) -> None:
        left = self.live.get(tenant, 0) - 1
        if left > 0:
            self.live[tenant] = left
            return
        self.live.pop(tenant, None)
        if len(self.counters) > 2 * len(self.live) + FORGET_AFTER:
            self._forget()

    def _forget(self) -> None:
        """Drop the counters of tenants out of the box that a lift would restore anyway
        (at or under the least counter in it): memory stays bounded by the tenants in the
        box and those still owing service, however many ids clients send."""
        counters = self.counters
        least = min((counters.get(t, 0.0) for t in self.live), default=float("inf"))
        for tenant in [t for t, c in counters.items() if t not in self.live and c <= least]:
            del counters[tenant]

    def favoured(self) -> frozenset[str]:
        """The tenants in the box under someone's share: all but those at the top (the
        highest counter, ties broken by more requests in the box). Their requests are
        served first in their band, at the instance too."""
        live = self.live
        if not self.counting or len(live) < 2:
            return frozenset()
        counters = self.counters
        top = max((counters.get(t, 0.0), n) for t, n in live.items())
        return frozenset(t for t, n in live.items() if (counters.get(t, 0.0), n) < top)

    def projected(self, tenant: str, tokens: float) -> float:
        """`tenant`'s counter once `tokens` more are computed for it."""
        return self.counters.get(tenant, 0.0) + tokens / self.weight(tenant)

"""Who pays: the request classes the ruler reports and floors (docs/design.md §2).

A capacity that holds 90 % goodput overall may do so by refusing one kind of request:
with a uniform TTFT target the costliest prompts are the cheapest to give up. So the
ruler also groups the measured requests into classes and reports each class's goodput:

* **prompt length**: the workload's quartiles (boundaries taken from the trace itself,
  the same for every layout and rate of a table, and printed with it);
* **SLO class**: a mixed-SLO workload's classes (`RequestRecord.slo_class`).
* **tenant**: a workload with a tenant mix's tenants (`RequestRecord.tenant`); a
  sheddable tenant's (priority < 0) goodput is reported but held to no floor: shedding it
  first is what its priority asks for.

Under a fair floor F a point holds *fairly* when it holds by the usual rule and every
class also reaches F (bench/ruler/steady_state.py). The share of prompt + output
tokens that belonged to good requests (token-weighted goodput) says the same from the
other side: refusing long prompts costs it more than request goodput.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec
import numpy as np

from bench.records.schema import RequestRecord
from bench.records.results import is_good, token_goodput_pct

#: The floor a class must reach for a point to hold fairly, as a share of its requests.
DEFAULT_FAIR_FLOOR = 0.8
QUARTILES = (0.25, 0.5, 0.75)


class RequestClasses(msgspec.Struct, frozen=True):
    """A workload's classes: prompt length `bounds[k-1] <= len < bounds[k]` is class k."""
    prompt_bounds: tuple[int, ...]

    @classmethod
    def from_prompts(cls, prompt_lens: Sequence[int]) -> RequestClasses:
        """Quartiles of these prompt lengths (duplicate boundaries merged)."""
        if not len(prompt_lens):
            raise ValueError("request classes need at least one prompt length")
        cuts = np.quantile(np.asarray(prompt_lens), QUARTILES, method="higher")
        bounds = sorted({int(c) for c in cuts} - {int(min(prompt_lens))})
        return cls(tuple(bounds))

    def prompt_labels(self) -> list[str]:
        b = self.prompt_bounds
        if not b:
            return ["prompt all"]
        return ([f"prompt <{b[0]}"] + [f"prompt {lo}-{hi - 1}" for lo, hi in zip(b, b[1:])]
                + [f"prompt >={b[-1]}"])

    def prompt_class(self, prompt_len: int) -> int:
        """The prompt-length class index of a prompt."""
        return int(np.searchsorted(self.prompt_bounds, prompt_len, side="right"))

    def prompt_classes(self, prompt_lens: Sequence[int]) -> np.ndarray:
        return np.searchsorted(self.prompt_bounds, np.asarray(prompt_lens), side="right")


class ClassGoodput(msgspec.Struct, frozen=True, omit_defaults=True):
    """One class's goodput among a run's measured requests."""
    name: str
    requests: int
    good: int
    goodput_pct: float
    #: Held to the fair floor (False: a sheddable tenant's, reported only).
    floored: bool = True


def class_goodput(records: Iterable[RequestRecord], classes: RequestClasses,
                  ttft_slo: float, tbt_slo: float) -> list[ClassGoodput]:
    """Goodput of every prompt-length class, then of every SLO class and every tenant the
    records carry (in order of first appearance; records without a tenant count as tenant
    "default" when others have one); a class with no requests is left out."""
    records = list(records)
    labels = classes.prompt_labels()
    counts: dict[str, list[int]] = {label: [0, 0] for label in labels}
    tenants = any(r.tenant is not None for r in records)
    sheddable: set[str] = set()
    for r in records:
        good = is_good(r, ttft_slo, tbt_slo)
        names = [labels[classes.prompt_class(r.prompt_len)]]
        if r.slo_class is not None:
            names.append(f"slo {r.slo_class}")
        if tenants:
            names.append(f"tenant {r.tenant or 'default'}")
            if r.priority < 0:
                sheddable.add(names[-1])
        for name in names:
            count = counts.setdefault(name, [0, 0])
            count[0] += 1
            count[1] += good
    return [ClassGoodput(name, n, good, round(100.0 * good / n, 2), name not in sheddable)
            for name, (n, good) in counts.items() if n]


def holds_floor(goodput: Sequence[ClassGoodput], floor: float) -> bool:
    """Every class held to the floor reaches `floor` (a share: 0.8 = 80 % goodput)."""
    return all(c.goodput_pct >= 100.0 * floor - 1e-9 for c in goodput if c.floored)


__all__ = ["DEFAULT_FAIR_FLOOR", "ClassGoodput", "RequestClasses", "class_goodput",
           "holds_floor", "token_goodput_pct"]

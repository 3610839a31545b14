"""How a multiplexed instance splits one step's token budget between its models
(MuxServe's adaptive batch scheduling, engines/mux_core.py).

Each step runs every model's part in turn, so the step lasts the sum of the parts: the
models share one step budget (`chunk_size` tokens) instead of each taking a whole one.
A model's weight is the square root of its popularity -- its recent arrival rate, an
exponentially decayed count of its requests -- over its TBT target (a model whose tokens must come sooner needs
more of each step); the budget is split by weight and handed out by water-filling: a
model that needs less than its share (its running decodes and queued prompt tokens) takes
only what it needs and the rest goes to the others, by weight. So a lone busy model gets
the whole budget, as a dedicated instance would, and under load each gets at least its
share.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

#: Seconds over which a model's arrival count decays to 1/e: its popularity follows the
#: traffic of the last minute or so.
POPULARITY_TAU = 30.0
#: A model's popularity before any request has come: every model starts equal.
PRIOR_ARRIVALS = 1.0
#: Requests an instance counts as carrying more, for routing a request of model m, when
#: it holds other models' requests and none of m's: sending it there makes every step
#: of that instance read a second model's weights (model-affine routing,
#: `model_affine_loads`).
MIX_PENALTY = 8
#: Least share of the budget a model with work is weighed at, however unpopular: its
#: prompts still move under contention (its decodes always run).
MIN_SHARE = 0.05


def decayed(count: float, since: float, tau: float = POPULARITY_TAU) -> float:
    """`count` after `since` seconds of exponential decay."""
    return count * math.exp(-max(since, 0.0) / tau)


def model_weight(arrivals: float, tbt_slo: float) -> float:
    """The square root of popularity over the TBT target (an unbounded target counts as
    one second). The root, not the rate itself: a rare model's queue is short but its
    prompts still have to meet their TTFT, and a share in proportion to its traffic
    chunks each of them into many steps; on the simulator (two 8B models at 80/20, seed
    0) the root held 6.0 QPS on two GPUs where the plain rate held 5.4 and equal weights
    5.9 (docs/seed_layouts.md)."""
    slo = tbt_slo if math.isfinite(tbt_slo) and tbt_slo > 0 else 1.0
    return math.sqrt(max(arrivals, 0.0)) / slo


def split_budget(total: int, weights: Sequence[float], demands: Sequence[int]) -> list[int]:
    """Token budgets summing to at most `total`: each model its weighted share, capped at
    its demand, the leftover shared again among those that want more (water-filling).
    A model's weight counts as at least MIN_SHARE of the total; every model with demand
    gets at least one token while any is left."""
    total_weight = sum(w for w in weights if w > 0)
    if total_weight <= 0:
        weights = [1.0] * len(weights)
    else:
        weights = [max(w / total_weight, MIN_SHARE) for w in weights]
    budgets = [0] * len(weights)
    wanting = [i for i, d in enumerate(demands) if d > 0 and weights[i] > 0]
    left = total
    while wanting and left > 0:
        weight = sum(weights[i] for i in wanting)
        shares = {i: max(1, int(left * weights[i] / weight)) for i in wanting}
        capped = [i for i in wanting if demands[i] - budgets[i] <= shares[i]]
        if not capped:  # every one wants more than its share: the shares are final
            for i in wanting:
                budgets[i] += shares[i]
            break
        for i in capped:  # these are satisfied; share the rest again among the others
            give = min(demands[i] - budgets[i], left)
            budgets[i] += give
            left -= give
        wanting = [i for i in wanting if i not in capped]
    return budgets


def model_affine_loads(in_flight: Mapping[int, int], held: Mapping[int, Mapping[str, int]],
                       model: str, penalty: int = MIX_PENALTY) -> dict[int, int]:
    """Each instance's requests in flight, plus `penalty` where a request of `model`
    would be the first of its model beside other models' (`held`: each instance's live
    requests by model): a least-loaded router then keeps a model's requests together
    while the loads allow, so fewer steps run two models' parts (MuxServe places models
    by popularity for the same reason)."""
    return {i: n + (penalty if not held.get(i, {}).get(model) and any(held.get(i, {}).values())
                    else 0)
            for i, n in in_flight.items()}

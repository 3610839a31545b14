"""A fleet on one clock: B simulated boxes behind a model of an inference gateway.

Each box is a whole `Simulation` (bench/sim/simulator.py: the daemon's controller core and
instance cores, its own layout); all of them share one `EventHeap`, so they run side by
side in virtual time. The gateway in front of them is the endpoint picker of the Gateway
API Inference Extension (bench/sim/endpoint_picker.py):

* every `refresh_interval` seconds it **scrapes** each box's protocol metrics --
  `daemon.gateway_view.gateway_view` of the box's controller core, exactly what the
  live daemon's /metrics shows -- and between scrapes it keeps those numbers, so its view
  is up to one interval old (0: a fresh view at every pick, a gateway that cannot be);
  all boxes are scraped at the same instants;
* when a request arrives it **picks** a box from that view (`GatewayConfig.picker`) and
  the request reaches the box at once (the gateway's own latency is not modelled).

Deterministic: the picker's random tie-breaks come from a generator seeded by `seed`.
"""
from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

from bench.loadgen.workload import WorkloadRequest
from bench.records.schema import RequestRecord
from bench.sim.event_heap import EventHeap
from bench.sim.sim_instances import SimConfig
from bench.sim.simulator import Simulation
from daemon.gateway_view import GatewayView, gateway_view
from bench.sim.endpoint_picker import EppWeights, Picker, pick_endpoint


class GatewayConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The gateway's settings; the defaults are the EPP's."""
    picker: Picker = Picker.EPP
    #: Seconds between metric scrapes: the EPP's `--refresh-metrics-interval` (50 ms).
    refresh_interval: float = 0.05
    weights: EppWeights = EppWeights()


class Pick(msgspec.Struct, frozen=True, array_like=True):
    """One routing decision: the request, its box, and how old the view was."""
    index: int
    box: int
    view_age: float                 # seconds since the scrape the picker read


class Fleet:
    def __init__(self, boxes: Sequence[SimConfig], workload: Sequence[WorkloadRequest],
                 gateway: GatewayConfig = GatewayConfig(), seed: int = 0) -> None:
        if not boxes:
            raise ValueError("a fleet needs at least one box")
        if gateway.refresh_interval < 0:
            raise ValueError(f"refresh_interval must be >= 0, got {gateway.refresh_interval}")
        self.gateway = gateway
        self.events = EventHeap()
        self.boxes = [Simulation(config, [], events=self.events) for config in boxes]
        self.picks: list[Pick] = []
        self._rng = np.random.default_rng(seed)
        self._views: list[GatewayView] = []
        self._scraped_at = 0.0
        #: Per box, the sum over scrapes of (waiting, running, KV use): what it showed.
        self._view_sums = np.zeros((len(boxes), 3))
        self._num_scrapes = 0
        self._scrape()
        for work in workload:
            self.events.at(work.arrival, self._arrive, work)
        self._last_arrival = max((w.arrival for w in workload), default=0.0)
        if gateway.refresh_interval > 0:
            self.events.at(gateway.refresh_interval, self._scrape_every)

    def run(self) -> list[RequestRecord]:
        """Every event to the end; every box's records."""
        while self.events:
            self.events.run_next()
        return [record for box in self.boxes for record in box.records.values()]

    def views(self) -> list[GatewayView]:
        """What the gateway believes of each box now (as of its last scrape)."""
        return list(self._views)

    def mean_views(self) -> list[tuple[float, float, float]]:
        """Per box, its mean (waiting, running, KV use) over the gateway's scrapes."""
        means = self._view_sums / max(1, self._num_scrapes)
        return [(float(w), float(r), float(k)) for w, r, k in means]

    # ---- the gateway -------------------------------------------------------------------
    def _scrape(self) -> None:
        self._views = [gateway_view(box.controller.view) for box in self.boxes]
        self._scraped_at = self.events.now
        self._view_sums += [(v.num_requests_waiting, v.num_requests_running,
                             v.kv_cache_usage_perc) for v in self._views]
        self._num_scrapes += 1

    def _scrape_every(self) -> None:
        """One scrape, and the next one while requests are still to come."""
        self._scrape()
        following = self.events.now + self.gateway.refresh_interval
        if following <= self._last_arrival + self.gateway.refresh_interval:
            self.events.at(following, self._scrape_every)

    def _arrive(self, work: WorkloadRequest) -> None:
        if self.gateway.refresh_interval == 0:
            self._scrape()
        box = pick_endpoint(self.gateway.picker, self._views, turn=len(self.picks),
                            tie_break=float(self._rng.random()), weights=self.gateway.weights)
        self.picks.append(Pick(work.index, box, self.events.now - self._scraped_at))
        self.boxes[box].arrive(work)

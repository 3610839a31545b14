"""The models one daemon serves, by name: a request's `model` picks its model's controller.

Each served model has a controller of its own (daemon/controller.py: its core, its
instance group, its tokenizer, its metrics); this is the map from names to them that the
HTTP API asks (daemon/api.py). A request without `model` goes to the first model; a name
not served is a 404 `model_not_found` in OpenAI's shape, naming `model`. The box-wide
views -- /health, /metrics, the probes -- combine the models' (daemon/health.py
`combine_health`, daemon/model_metrics.py), and the lifecycle (start, drain, stop) runs
over every controller at once.
"""
from __future__ import annotations

import asyncio
from collections.abc import Sequence

from daemon.errors import ApiError
from daemon.health import Health, Probe, combine_health
from daemon.model_metrics import render_metrics


class ServedModels:
    def __init__(self, controllers: Sequence) -> None:
        """`controllers`: one per model, each with its `model_name` (unique), the first the
        default."""
        self.by_name = {c.model_name: c for c in controllers}
        if len(self.by_name) != len(controllers):
            raise ValueError(f"served model names repeat: {[c.model_name for c in controllers]}")
        self.default = controllers[0]

    @property
    def names(self) -> list[str]:
        return list(self.by_name)

    @property
    def controllers(self) -> list:
        return list(self.by_name.values())

    def pick(self, name: str | None):
        """The controller serving `name` (left out or "": the first model's)."""
        if not name:
            return self.default
        controller = self.by_name.get(name)
        if controller is None:
            raise model_not_found(name, self.names)
        return controller

    # ---- box-wide views -----------------------------------------------------------------
    def health(self) -> Health:
        return combine_health([c.health() for c in self.controllers])

    def render_metrics(self) -> bytes:
        return render_metrics({name: c.metrics.registry for name, c in self.by_name.items()})

    def liveness(self) -> Probe:
        return _combine_probes({name: c.liveness() for name, c in self.by_name.items()})

    def readiness(self) -> Probe:
        return _combine_probes({name: c.readiness() for name, c in self.by_name.items()})

    def serving(self) -> bool:
        """Every model has an instance that serves (what the systemd watchdog is fed on)."""
        return all(c.view.ready_ids() for c in self.controllers)

    # ---- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Start every model's instances at once; the first failure is raised once all
        starts have ended (the caller then stops them all)."""
        results = await asyncio.gather(*(c.start() for c in self.controllers),
                                       return_exceptions=True)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            raise failed

    async def drain(self, timeout: float) -> None:
        await asyncio.gather(*(c.drain(timeout) for c in self.controllers))

    async def stop(self) -> None:
        await asyncio.gather(*(c.stop() for c in self.controllers))


def model_not_found(name: str, served: list[str]) -> ApiError:
    """vLLM's 404 for a model it does not serve, in OpenAI's error shape."""
    names = ", ".join(repr(n) for n in served)
    error = ApiError(404, f"The model {name!r} does not exist; this server serves {names}",
                     "model_not_found")
    error.param = "model"
    return error


def _combine_probes(by_model: dict[str, Probe]) -> Probe:
    """OK when every model's probe is; the reason names the models that are not."""
    probes = list(by_model.values())
    if len(probes) == 1:
        return probes[0]
    return Probe(ok=all(p.ok for p in probes),
                 reason="; ".join(f"{name}: {probe.reason}" for name, probe in by_model.items()
                                  if not probe.ok),
                 instances_ready=sum(p.instances_ready for p in probes),
                 instances=sum(p.instances for p in probes))

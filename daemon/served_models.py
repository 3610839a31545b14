"""The models one daemon serves, by name: a request's `model` picks its model's controller.

Each served model has a controller of its own (daemon/controller.py: its core, its
instance group, its tokenizer, its metrics) -- or shares one with the models it is
multiplexed with (`[model] placement`: the group's instances hold them all); this is the
map from names to them that the HTTP API asks (daemon/api.py), through a `ModelPort`
per name: its controller as that model's, its requests stamped with its name. A request without `model` goes to the first model; a name
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


class ModelPort:
    """One served model as the HTTP API sees it: its controller's tokenizer, limits and
    tenants under the model's own name; `submit` names the model to a multiplexed
    group's instances."""

    def __init__(self, controller, name: str) -> None:
        self.controller, self.model_name = controller, name
        self.tokenizer, self.vocab_size = controller.tokenizer, controller.vocab_size
        self.tenants = controller.tenants
        #: the name the instances are told ("" for a controller of one model: its only one)
        self._model = name if len(controller.model_names) > 1 else ""

    @property
    def max_model_len(self) -> int:
        return self.controller.max_model_len

    async def submit(self, prompt_token_ids, sampling, **fields):
        return await self.controller.submit(prompt_token_ids, sampling, model=self._model,
                                            **fields)


class ServedModels:
    def __init__(self, controllers: Sequence) -> None:
        """`controllers`: one per model or model group, each with its `model_name` (its
        label in /health and /metrics, unique) and `model_names` (the served names it
        answers for: a group's several); the first controller's first name is the
        default. A name several controllers answer for (a model multiplexed on some GPUs
        and dedicated on others) goes to the least loaded of them."""
        labels = [c.model_name for c in controllers]
        if len(set(labels)) != len(labels):
            raise ValueError(f"served model names repeat: {labels}")
        self._controllers = list(controllers)
        self.ports_of: dict[str, list[ModelPort]] = {}
        for controller in controllers:
            for name in controller.model_names:
                self.ports_of.setdefault(name, []).append(ModelPort(controller, name))
        self.default_name = controllers[0].model_names[0]

    @property
    def names(self) -> list[str]:
        return list(self.ports_of)

    @property
    def by_name(self) -> dict[str, "ModelPort"]:
        """Each served name's first port (what /v1/models/{name} describes)."""
        return {name: ports[0] for name, ports in self.ports_of.items()}

    @property
    def controllers(self) -> list:
        return list(self._controllers)

    @property
    def ports(self) -> list[ModelPort]:
        """One port per served name, in order."""
        return [ports[0] for ports in self.ports_of.values()]

    def pick(self, name: str | None) -> ModelPort:
        """The port of the model `name` (left out or "": the first model's); of several,
        the one whose controller has the fewest requests in flight per ready instance."""
        ports = self.ports_of.get(name or self.default_name)
        if ports is None:
            raise model_not_found(name, self.names)
        if len(ports) == 1:
            return ports[0]
        return min(ports, key=_load)

    # ---- box-wide views -----------------------------------------------------------------
    def health(self) -> Health:
        return combine_health([c.health() for c in self.controllers])

    def render_metrics(self) -> bytes:
        return render_metrics({c.model_name: c.metrics.registry for c in self.controllers})

    def liveness(self) -> Probe:
        return _combine_probes({c.model_name: c.liveness() for c in self.controllers})

    def readiness(self) -> Probe:
        return _combine_probes({c.model_name: c.readiness() for c in self.controllers})

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


def _load(port: ModelPort) -> float:
    """Requests in flight per ready instance of the port's controller (none ready: last)."""
    view = port.controller.view
    ready = len(view.ready_ids())
    return view.requests_in_flight / ready if ready else float("inf")


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

"""Latency functions for the sim executor: how long one batch takes, in seconds.

A latency function is `fn(batch) -> seconds`. Config names one by a spec string,
`name` or `name:argument` ("zero", "constant:0.01", "profile:a100-llama3-8b");
`make_latency` turns the spec into a function through a table of factories. "profile:<name>" is a GPU latency
profile (engines.executors.profiles), imported only when asked for.
"""
from __future__ import annotations

from collections.abc import Callable

from engines.batch import Batch

LatencyFn = Callable[[Batch], float]
#: Builds a latency function from the text after "name:" (None when there is none).
LatencyFactory = Callable[[str | None], LatencyFn]


def zero_latency(batch: Batch) -> float:
    """Every batch is instant: measures the serving stack's own overhead."""
    return 0.0


def constant_latency(seconds: float) -> LatencyFn:
    """Every batch takes `seconds`, whatever it holds."""
    if not seconds >= 0.0:  # also refuses NaN
        raise ValueError(f"constant latency must be >= 0 seconds, got {seconds}")

    def latency(batch: Batch) -> float:
        return seconds

    latency.__name__ = f"constant_latency_{seconds}"
    return latency


def _zero_factory(arg: str | None) -> LatencyFn:
    if arg not in (None, ""):
        raise ValueError(f"latency 'zero' takes no argument, got {arg!r}")
    return zero_latency


def _constant_factory(arg: str | None) -> LatencyFn:
    try:
        return constant_latency(float(arg or ""))
    except ValueError:
        raise ValueError(f"latency 'constant' needs seconds >= 0, as in 'constant:0.01'; "
                         f"got {arg!r}") from None


def _profile_factory(arg: str | None) -> LatencyFn:
    from engines.executors.profiles import profile_latency, profile_names
    if not arg:
        raise ValueError(f"latency 'profile' needs a profile name, as in "
                         f"'profile:a100-llama3-8b'; choose one of {profile_names()}")
    return profile_latency(arg)


LATENCY_FACTORIES: dict[str, LatencyFactory] = {
    "zero": _zero_factory,
    "constant": _constant_factory,
    "profile": _profile_factory,
}


def make_latency(spec: str) -> LatencyFn:
    """The latency function a spec names: "zero", "constant:0.01", "profile:a100-llama3-8b"."""
    name, sep, arg = spec.strip().partition(":")
    factory = LATENCY_FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown latency {name!r}; choose one of {sorted(LATENCY_FACTORIES)}")
    return factory(arg if sep else None)

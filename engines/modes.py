"""Scheduling modes: the knobs that make one scheduler behave as vLLM, Sarathi-Serve, ...

A mode is data plus policy functions, so new modes (issue #4's `lp` and `hp`)
plug in here instead of copying the scheduler.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from engines.request import Request

#: Orders waiting requests for admission, most urgent first: (waiting, now) -> requests.
WaitingOrder = Callable[[Sequence[Request], float], Iterable[Request]]


@dataclass(frozen=True)
class Mode:
    name: str
    #: True: admit waiting prompts first and let decodes wait (vLLM). False: every running
    #: decode first, then prefill chunks in what is left of the token budget (Sarathi-Serve).
    prefill_first: bool
    #: Split prompts into chunks to fit the token budget (else a prompt runs whole).
    chunked_prefill: bool
    #: None keeps the waiting queue's arrival order (first come, first served).
    order_waiting: WaitingOrder | None = None


SARATHI = Mode("sarathi", prefill_first=False, chunked_prefill=True)
VLLM = Mode("vllm", prefill_first=True, chunked_prefill=False)

MODES: dict[str, Mode] = {m.name: m for m in (SARATHI, VLLM)}


def get_mode(name: str) -> Mode:
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"unknown scheduler mode {name!r}; choose one of {sorted(MODES)}") from None

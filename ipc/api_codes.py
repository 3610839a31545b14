"""The HTTP API's contract with its clients: why a request was refused, and the error
code (OpenAI's `code`) of one that ended without completing. The daemon answers with
these; load generators and the chaos client read them -- without importing the
daemon's internals.
"""
from __future__ import annotations

import enum

from ipc.messages import FinishReason


class Refusal(str, enum.Enum):
    """Why a new request was not accepted (a 503 with Retry-After)."""

    STARTING = "starting"
    SHUTTING_DOWN = "shutting_down"
    QUEUE_FULL = "queue_full"
    NO_INSTANCE = "no_instance"


class EndCode(str, enum.Enum):
    """The error code of a request that ended without completing (OpenAI's `code`)."""

    TTFT_SLO_MISSED = FinishReason.DROP.value
    #: It waited past its queue TTL (llm-d's `x-llm-d-inference-ttl`) for its prefill.
    TTL_EXPIRED = "ttl_expired"
    INSTANCE_FAILED = "instance_failed"
    SHUTTING_DOWN = "shutting_down"
    UNAVAILABLE = "unavailable"
    ENDED_EARLY = "ended_early"
    INVALID = "invalid_request"
    INTERNAL = "internal_error"


#: Error code of each refusal of a new request; all are 503 + Retry-After.
REFUSAL_CODES = {Refusal.STARTING: "unavailable", Refusal.SHUTTING_DOWN: "shutting_down",
                 Refusal.QUEUE_FULL: "queue_full", Refusal.NO_INSTANCE: "unavailable"}

#: The codes of a request the server shed under load before its first token -- it would
#: miss its TTFT target, it waited past its queue TTL, or the waiting room was full: a
#: run's records call it *dropped* (a measurement of the server), any other failure
#: *errored*.
SHED_CODES = frozenset({EndCode.TTFT_SLO_MISSED.value, EndCode.TTL_EXPIRED.value,
                        REFUSAL_CODES[Refusal.QUEUE_FULL]})

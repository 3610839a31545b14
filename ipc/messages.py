"""Messages between the controller and the instances: two tagged unions of msgspec structs.

Every message is a `msgspec.Struct` whose msgpack form carries its kind in a "type"
field, so one typed decoder per direction (`ipc.codec`) turns a frame into exactly
one of the structs below or rejects it. Unknown fields are refused (strict wire).

Controller -> instance (`ToInstance`): Submit, Abort, Ping, Shutdown.
Instance -> controller (`ToController`): Ready, StepOutputs, Finished, RequestError,
Heartbeat, Offload, Ticket, InstanceFailed.

Every Submit gets exactly one terminal outcome from the instance:
  * a `TokenOutput` with `finish_reason` set ("stop" | "length") inside a StepOutputs,
  * a `Finished` (the request ended without a new token: "abort", or "ttft_slo_missed"
    when it was dropped),
  * an `Offload` naming it (it left for an HP instance; the HP then owes the outcome),
  * or a `RequestError` (refused: prompt too long, duplicate id, bad token ids, ...).
After its terminal outcome the request holds no KV blocks in the instance.

Times are `time.monotonic()` seconds: all processes are on one host and share that clock.
"""
from __future__ import annotations

from typing import Annotated, Union

import msgspec
from msgspec import Meta

from ipc.params import SamplingParams

RequestId = Annotated[str, Meta(min_length=1, max_length=256)]
TokenId = Annotated[int, Meta(ge=0)]
InstanceId = Annotated[int, Meta(ge=0)]
Count = Annotated[int, Meta(ge=0)]
Seconds = Annotated[float, Meta(ge=0.0)]


class TokenOutput(msgspec.Struct, array_like=True, frozen=True):
    """One new token of one request from one engine step; `finish_reason` set on its last."""

    request_id: str
    token_id: int
    finish_reason: str | None = None


class _Message(msgspec.Struct, tag_field="type", frozen=True, forbid_unknown_fields=True,
               kw_only=True):
    """Base of every wire message: tagged by a lowercase `type` name."""


# ---- controller -> instance -------------------------------------------------------------

class Submit(_Message, tag="submit"):
    """A new request for the instance. `deadline` is an absolute monotonic time (the TTFT
    deadline, arrival + TTFT SLO); None lets the instance derive it from `ttft_slo`."""

    request_id: RequestId
    prompt_token_ids: Annotated[list[TokenId], Meta(min_length=1)]
    sampling: SamplingParams
    arrival_time: float
    deadline: float | None = None
    ttft_slo: Seconds | None = None
    tbt_slo: Seconds | None = None
    priority: int = 0
    offloaded: bool = False  # moved here from an LP instance (prompt tokens only)
    #: Preempted elsewhere and recomputed here: the continuation of a request whose
    #: instance died mid-decode (the prompt holds its output so far), or an offload no HP
    #: could take. Treated as a request preempted by recompute: never offloaded or dropped.
    preempted: bool = False


class Abort(_Message, tag="abort"):
    """Cancel a request; answered by `Finished(reason="abort")` if it was still alive."""

    request_id: RequestId


class Ping(_Message, tag="ping"):
    """Liveness from the controller; answered at once by a Heartbeat echoing `ping_id`."""

    ping_id: int = 0


class Shutdown(_Message, tag="shutdown"):
    """Stop now: unfinished requests end with Finished("abort"), then the process exits 0."""


# ---- instance -> controller -------------------------------------------------------------

class Ready(_Message, tag="ready"):
    """First message of an instance: it has built its executor and serves from now on."""

    instance_id: InstanceId
    role: str             # what the controller routes by: a mode name now, "lp"/"hp" later
    mode: str             # the scheduler mode
    executor: str         # "torch" | "sim"
    pid: int
    num_kv_blocks: int
    block_size: int
    max_model_len: int    # the longest context one request may reach here


class StepOutputs(_Message, tag="step_outputs"):
    """The new tokens of every request from one engine step (one message per step that
    produced tokens). `time` is when the step ended; `step_time` how long it ran."""

    instance_id: InstanceId
    step: Count
    time: float
    step_time: Seconds
    outputs: list[TokenOutput]


class Finished(_Message, tag="finished"):
    """A request ended without a new token (e.g. aborted); its KV blocks are free."""

    instance_id: InstanceId
    request_id: RequestId
    reason: str


class RequestError(_Message, tag="request_error"):
    """A submit the instance refused; the request was never queued."""

    instance_id: InstanceId
    request_id: RequestId
    message: str


class Heartbeat(_Message, tag="heartbeat"):
    """Periodic stats (every heartbeat interval), and the answer to a Ping."""

    instance_id: InstanceId
    time: float
    ping_id: int | None = None  # set when this answers a Ping
    num_waiting: Count = 0
    num_running: Count = 0
    num_kv_blocks_used: Count = 0
    num_kv_blocks: Count = 0
    num_preemptions: Count = 0
    num_steps: Count = 0
    num_bad_frames: Count = 0  # malformed or unknown frames dropped so far
    num_finished: Count = 0    # requests served to the end (stop or length)
    num_offloaded: Count = 0
    num_dropped: Count = 0
    perf_model_mape: float | None = None  # held-out error of the performance model, 0.1 = 10%


class OffloadedRequest(msgspec.Struct, array_like=True, frozen=True):
    request_id: RequestId
    prompt_token_ids: list[TokenId]


class Offload(_Message, tag="offload"):
    """An LP instance gives up requests whose prefill has not started (they would miss
    their deadline here); the controller resubmits them to an HP instance. Prompt tokens
    only: no KV cache ever moves. The LP holds nothing for them any more."""

    instance_id: InstanceId
    requests: list[OffloadedRequest]


class Ticket(_Message, tag="ticket"):
    """An HP instance with nothing waiting and room to spare asks for the next new request.
    At most one is open per HP; it closes when the controller routes a request to it."""

    instance_id: InstanceId


class InstanceFailed(_Message, tag="instance_failed"):
    """Last words of an instance that hit an unexpected error; it exits non-zero next."""

    instance_id: InstanceId
    message: str


ToInstance = Union[Submit, Abort, Ping, Shutdown]
ToController = Union[Ready, StepOutputs, Finished, RequestError, Heartbeat, Offload, Ticket,
                     InstanceFailed]

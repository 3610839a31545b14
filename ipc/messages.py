"""Messages between the controller and the instances: two tagged unions of msgspec structs.

Every message is a `msgspec.Struct` whose msgpack form carries its kind in a "type"
field, so one typed decoder per direction (`ipc.codec`) turns a frame into exactly
one of the structs below or rejects it. Unknown fields are refused (strict wire).

Controller -> instance (`ToInstance`): Submit, Abort, Ping, Shutdown, SubmitPrefilled,
SetRole, EspJoin, EspGo, EspLeave.
Instance -> controller (`ToController`): Ready, StepOutputs, Finished, RequestError,
Heartbeat, Offload, Ticket, InstanceFailed, Handoff, RoleChanged, EspJoined.

Every Submit gets exactly one terminal outcome from the instance:
  * a token marked finished ("stop" | "length") in a StepOutputs' `tokens`,
  * a `Finished` (the request ended without a new token: ABORT, or DROP when it was
    dropped),
  * an `Offload` naming it (it left for an HP instance; the HP then owes the outcome),
  * a `RoleChanged` naming it among `returned` (the instance changed role before its
    prefill started; the controller binds it again),
  * a `Handoff` naming it (a P/D layout's prefill instance passed it, KV and all, to a
    decode instance, which then owes the outcome),
  * or a `RequestError` (refused: prompt too long, duplicate id, bad token ids, ...).
After its terminal outcome the request holds no KV blocks in the instance.

Times are `time.monotonic()` seconds: all processes are on one host and share that clock.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Annotated, Union

import msgspec
from msgspec import Meta

from ipc.params import SamplingParams

RequestId = Annotated[str, Meta(min_length=1, max_length=256)]
TokenId = Annotated[int, Meta(ge=0)]
InstanceId = Annotated[int, Meta(ge=0)]
Count = Annotated[int, Meta(ge=0)]
Seconds = Annotated[float, Meta(ge=0.0)]


class FinishReason(str, enum.Enum):
    """Why an instance stopped serving a request (its last word about it)."""

    STOP = "stop"              # EOS or a stop token
    LENGTH = "length"          # max_tokens or the model's context limit
    ABORT = "abort"            # cancelled by the client or the controller
    OFFLOAD = "offload"        # handed to an HP instance before its prefill started
    DROP = "ttft_slo_missed"   # given up on: its TTFT SLO is lost (drop_expired)


class Origin(str, enum.Enum):
    """How a Submit came to be: what an instance may still do with the request."""

    NEW = "new"                # a new request from a client (it uses an HP's open ticket)
    OFFLOAD = "offload"        # an LP gave it up before its prefill started; on to an HP
    RESCUE = "rescue"          # the controller's waiting room sent it to an HP, late for an LP
    RESUBMIT = "resubmit"      # its instance died before its first token
    RESUME = "resume"          # its instance died mid-decode: the prompt holds its output so far
    REROUTE = "reroute"        # an offload no HP could take, back on an LP

    @property
    def pinned(self) -> bool:
        """It stays where it is sent: never offloaded, dropped or demoted (a resumed request
        met its TTFT long ago; a rerouted offload has nowhere better to go)."""
        return self in (Origin.RESUME, Origin.REROUTE)


class Role(str, enum.Enum):
    """What the controller routes by: Ascendra's two kinds, or one of identical peers."""

    LP = "lp"
    HP = "hp"
    PEER = "peer"              # a baseline layout's instance (3xsarathi, 3xvllm)
    PREFILL = "prefill"        # a P/D layout's prefill instance: prompts to the first token
    DECODE = "decode"          # a P/D layout's decode instance: takes prefilled requests


#: The floor a log-probability is reported at: vLLM's stand-in for -inf (JSON has none).
MIN_LOGPROB = -9999.0


class TokenLogprobs(msgspec.Struct, array_like=True, frozen=True):
    """A sampled token's log-probability under the model's raw distribution (before
    penalties, bias and temperature, as vLLM reports it) and the `SamplingParams.logprobs`
    most likely tokens with theirs, most likely first."""

    logprob: float
    top_token_ids: list[int] = []
    top_logprobs: list[float] = []


class TokenOutput(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One new token of one request, as its client's stream takes it (`StepTokens.output`:
    the wire carries a step's tokens as columns); `finish_reason` set on its last,
    `logprobs` only when the request asked for them. `gc=False` (one per streamed token;
    it can be in no reference cycle)."""

    request_id: str
    token_id: int
    finish_reason: FinishReason | None = None
    logprobs: TokenLogprobs | None = None


class StepTokens(msgspec.Struct, array_like=True, frozen=True):
    """One engine step's new tokens as columns, in the step's order: request
    `request_ids[i]` got token `token_ids[i]`. `finished` maps the position of a token
    that is its request's last to why; `logprobs` the position of a token of a request
    that asked for them to theirs. A step carries a token of every running request (a
    hundred or more): one list each, not a `TokenOutput` struct per token, is what the
    instance builds, the wire carries and the controller reads in bulk."""

    request_ids: list[RequestId] = []
    token_ids: list[TokenId] = []
    finished: dict[int, FinishReason] = {}
    logprobs: dict[int, TokenLogprobs] = {}

    def __post_init__(self) -> None:
        """Columns of one length, positions within them (a frame that breaks either is
        refused when it is decoded)."""
        n = len(self.request_ids)
        if len(self.token_ids) != n:
            raise ValueError(f"{n} request ids but {len(self.token_ids)} token ids")
        if any(not 0 <= i < n for i in (*self.finished, *self.logprobs)):
            raise ValueError(f"a finish reason or logprobs at a position outside 0..{n - 1}")

    @classmethod
    def of(cls, outputs: Iterable[TokenOutput]) -> StepTokens:
        """The columns of `outputs`, one struct per token."""
        outputs = list(outputs)
        return cls([o.request_id for o in outputs], [o.token_id for o in outputs],
                   {i: FinishReason(o.finish_reason) for i, o in enumerate(outputs)
                    if o.finish_reason is not None},
                   {i: o.logprobs for i, o in enumerate(outputs) if o.logprobs is not None})

    def __len__(self) -> int:
        return len(self.request_ids)

    def output(self, i: int) -> TokenOutput:
        """Its `i`-th token as one struct (what a client's stream takes)."""
        return TokenOutput(self.request_ids[i], self.token_ids[i], self.finished.get(i),
                           self.logprobs.get(i))

    def outputs(self) -> list[TokenOutput]:
        """Every token as one struct each, in order."""
        return [self.output(i) for i in range(len(self.request_ids))]

    def only(self, positions: Iterable[int]) -> StepTokens:
        """The tokens at `positions` (ascending), renumbered."""
        kept = list(positions)
        new = {old: i for i, old in enumerate(kept)}
        return StepTokens([self.request_ids[i] for i in kept], [self.token_ids[i] for i in kept],
                          {new[i]: r for i, r in self.finished.items() if i in new},
                          {new[i]: p for i, p in self.logprobs.items() if i in new})


class InstanceLoad(msgspec.Struct, array_like=True, frozen=True):
    """How much prefill work an instance has queued, as of the end of a step: what the
    controller binds waiting requests and gates offloads by."""

    accepted: Count                 # Submits it has taken in so far (the rest are in flight)
    queued_prefill_tokens: Count    # prompt tokens not yet computed (waiting or mid-prefill)
    queued_prefill_seconds: Seconds  # its performance model's time for them (0 without one)
    num_running: Count
    #: Prompt tokens per second it has been computing while it had more waiting (a moving
    #: average over such steps, decodes sharing them included); 0 until known.
    prefill_rate: Annotated[float, Meta(ge=0.0)] = 0.0
    num_kv_blocks_used: Count = 0   # KV blocks in use (of Ready.num_kv_blocks)
    #: Of `queued_prefill_tokens`, those of sheddable requests (priority < 0): it serves
    #: them after every other, so they are not ahead of a request that is not sheddable.
    queued_sheddable_tokens: Count = 0


class _Message(msgspec.Struct, tag_field="type", frozen=True, forbid_unknown_fields=True,
               kw_only=True):
    """Base of every wire message: tagged by a lowercase `type` name."""


# ---- controller -> instance -------------------------------------------------------------

class EspPart(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """An instance's place in one request's ESP group (elastic sequence parallelism,
    engines/models/sequence_parallel.py): the group's instances, its master (the decode
    owner) first, and this instance's rank among them."""

    group: Annotated[list[InstanceId], Meta(min_length=2)]
    rank: Annotated[int, Meta(ge=0)]


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
    #: Its tenant is under its fair share (docs/design.md §5.11): served before the
    #: requests of its band that are not.
    favoured: bool = False
    origin: Origin = Origin.NEW
    #: RESUME: the last this-many prompt tokens are the output it generated before (what
    #: presence and frequency penalties count).
    generated_before: Count = 0
    #: Its ESP group, this instance its master (rank 0): it prefills its stripe of the
    #: prompt with the group (after `EspGo`) and then decodes it here; None: served alone.
    esp: EspPart | None = None
    #: Which of a multiplexed instance's models serves it (its served name; "" = the
    #: instance's first, or only, model).
    model: str = ""


class Abort(_Message, tag="abort"):
    """Cancel a request; answered by `Finished(reason="abort")` if it was still alive."""

    request_id: RequestId


class Ping(_Message, tag="ping"):
    """Liveness from the controller; answered at once by a Heartbeat echoing `ping_id`."""

    ping_id: int = 0


class Shutdown(_Message, tag="shutdown"):
    """Stop now: unfinished requests end with Finished("abort"), then the process exits 0."""


class SetRole(_Message, tag="set_role"):
    """Take this role (LP or HP) and its scheduler mode at the next step boundary (a
    layout whose roles are chosen online, `<n>A`; docs/design.md §5.10). Answered by
    `RoleChanged`: the waiting requests whose prefill has not started go back with it,
    the running ones finish here."""

    role: Role
    mode: str


# ---- instance -> controller -------------------------------------------------------------

class Ready(_Message, tag="ready"):
    """First message of an instance: it has built its executor and serves from now on."""

    instance_id: InstanceId
    role: Role            # what the controller routes by
    mode: str             # the scheduler mode
    executor: str         # "torch" | "sim"
    pid: int
    num_kv_blocks: int
    block_size: int
    max_model_len: int    # the longest context one request may reach here
    #: (prompt tokens, predicted seconds to prefill them here) at a few lengths: its
    #: performance model's curve, for the controller's own estimates (empty without one).
    prefill_curve: list[tuple[int, float]] = []
    token_budget: Count = 0  # tokens one of its steps may run (its chunk size)
    #: It keeps full KV blocks by name (policies/prefix_hash.py) and reuses them.
    prefix_caching: bool = False
    #: Its tensor-parallel degree: the model runs over this many ranks (processes).
    tp: Count = 1
    #: The GPU ids it is pinned to (CUDA_VISIBLE_DEVICES; rank r uses the r-th); empty: the
    #: CPU, or every GPU (not pinned).
    devices: list[int] = []
    #: The pids of its ranks 1..tp-1 (rank 0 is `pid`).
    rank_pids: list[int] = []
    #: A multiplexed instance: the served names of the models it holds (its KV pool
    #: shared by them; `num_kv_blocks` and the curve are its first model's); empty: one.
    models: list[str] = []


class CachedPrompt(msgspec.Struct, array_like=True, frozen=True):
    """A request's first admission on an instance found this many of its prompt tokens in
    the prefix cache (OpenAI's `usage.prompt_tokens_details.cached_tokens`)."""

    request_id: str
    num_cached_tokens: Count


class StepOutputs(_Message, tag="step_outputs"):
    """The new tokens of every request from one engine step (one message per step, tokens
    or not), and the instance's load after it. `time` is when the step ended;
    `step_seconds` how long it ran."""

    instance_id: InstanceId
    step: Count
    time: float
    step_seconds: Seconds
    tokens: StepTokens
    load: InstanceLoad | None = None
    #: Requests first admitted this step that found some of their prompt cached.
    cached: list[CachedPrompt] = []
    #: Requests whose prefill started this step (first admitted on this instance): the
    #: controller times their queueing delay by it (a client's `serving_info.queue_delay`).
    admitted: list[RequestId] = []


class Finished(_Message, tag="finished"):
    """A request ended without a new token (e.g. aborted); its KV blocks are free."""

    instance_id: InstanceId
    request_id: RequestId
    reason: FinishReason


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
    #: Prefix cache lookups at admission since the start: full blocks and tokens looked
    #: up, and those found cached.
    prefix_queried_blocks: Count = 0
    prefix_hit_blocks: Count = 0
    prefix_queried_tokens: Count = 0
    prefix_hit_tokens: Count = 0
    #: A multiplexed instance: each model's KV blocks in use (in its own blocks), by name.
    kv_blocks_by_model: dict[str, Count] = {}


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


class RoleChanged(_Message, tag="role_changed"):
    """The answer to `SetRole`: the role and mode the instance serves in from now on (its
    old ones if it could not change: a mode without a performance model), and the
    requests it gave back -- waiting, prefill not started, not pinned: prompt tokens
    only, as an `Offload`. It holds nothing for them any more."""

    instance_id: InstanceId
    role: Role
    mode: str
    returned: list[OffloadedRequest] = []
    load: InstanceLoad | None = None  # its load once they are gone


# ---- P/D disaggregation (DistServe layouts, `<n>P<m>D`) ---------------------------------

class KvLayout(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """The header of a request's KV cache travelling as raw frames after its message: one
    frame per layer, each the layer's K then V blocks, C-contiguous, of shape
    (2, num_blocks, block_size, num_kv_heads, head_dim) and `dtype` (a torch dtype name).
    Only the first `num_tokens` token slots are meaningful."""

    num_layers: Annotated[int, Meta(ge=1)]
    num_blocks: Annotated[int, Meta(ge=1)]
    block_size: Annotated[int, Meta(ge=1)]
    num_kv_heads: Annotated[int, Meta(ge=1)]
    head_dim: Annotated[int, Meta(ge=1)]
    dtype: Annotated[str, Meta(max_length=32)]
    num_tokens: Annotated[int, Meta(ge=1)]

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of one layer's frame."""
        return (2, self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim)


class Handoff(_Message, tag="handoff"):
    """A prefill instance has run a request's prompt to its first token (already sent in a
    StepOutputs) and gives the request up, its KV cache with it: `token_ids` is the prompt
    and every token generated so far, of which the first `num_computed_tokens` are in the
    KV. `kv` set: `kv.num_layers` raw frames follow this one (torch executor); None: no
    KV travels (the sim executor has none; a simulator charges its transfer time). The
    prefill instance holds nothing for it any more."""

    instance_id: InstanceId
    request_id: RequestId
    token_ids: Annotated[list[TokenId], Meta(min_length=1)]
    num_computed_tokens: Annotated[int, Meta(ge=1)]
    kv: KvLayout | None = None


class SubmitPrefilled(_Message, tag="submit_prefilled"):
    """Controller -> decode instance: a request whose first `num_computed_tokens` of
    `token_ids` have their KV computed (it follows as `kv.num_layers` raw frames when `kv`
    is set). The instance allocates blocks for them, writes the KV in and decodes on;
    without room it recomputes them instead (greedy output is the same). `submit` is
    the request as first sent (SLOs, sampling, arrival)."""

    submit: Submit
    token_ids: Annotated[list[TokenId], Meta(min_length=1)]
    num_computed_tokens: Annotated[int, Meta(ge=1)]
    kv: KvLayout | None = None

    @property
    def request_id(self) -> str:
        return self.submit.request_id


class EspJoin(_Message, tag="esp_join"):
    """Controller -> an ESP group's other instance (rank >= 1): hold room for its stripe of
    the request's prompt and answer `EspJoined`; after `EspGo` compute that stripe with
    the group and keep its KV until `EspLeave`."""

    request_id: RequestId
    prompt_token_ids: Annotated[list[TokenId], Meta(min_length=1)]
    part: EspPart


class EspGo(_Message, tag="esp_go"):
    """Controller -> every instance of an ESP group, once all joined: run the group's
    prefill step at the next step boundary (`alone`: the master only -- the group did not
    form, and it serves the request by itself as any other)."""

    request_id: RequestId
    alone: bool = False


class EspLeave(_Message, tag="esp_leave"):
    """Controller -> an ESP group's other instance: the request ended or the group
    dissolved; free its stripe (nothing is answered). `lost`: because a member stopped
    (a member waiting for the group's others in its step stops waiting)."""

    request_id: RequestId
    lost: bool = False


class EspJoined(_Message, tag="esp_joined"):
    """Instance -> controller: its answer to an ESP group's `Submit` or `EspJoin`;
    `refused`: why it cannot hold its stripe (no KV room), "" when it can."""

    instance_id: InstanceId
    request_id: RequestId
    refused: str = ""


ToInstance = Union[Submit, Abort, Ping, Shutdown, SubmitPrefilled, SetRole, EspJoin, EspGo,
                   EspLeave]
ToController = Union[Ready, StepOutputs, Finished, RequestError, Heartbeat, Offload, Ticket,
                     InstanceFailed, Handoff, RoleChanged, EspJoined]

"""What goes into the controller core (events) and what comes out (actions).

Every event carries `now`, stamped by the driver (`time.monotonic()` in the daemon, the
virtual clock in the simulator): the core never reads a clock. Actions are instructions
and observations for the driver -- send this message, pass these tokens on, this request
has ended, wake me at this time -- and the daemon's metrics and the simulator's
per-request records are both built from them, so both measure the same things.
"""
from __future__ import annotations

from dataclasses import dataclass

import msgspec

from daemon.core.request_state import Outcome
from ipc.api_codes import EndCode, Refusal
from ipc.messages import Origin, Ready, Role, StepTokens, ToController, ToInstance
from ipc.params import SamplingParams
from policies.tenants import DEFAULT_TENANT


# ---- events: driver -> core ---------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Arrived:
    """A client's new request; SLOs None take the configured defaults."""
    now: float
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    ttft_slo: float | None = None
    tbt_slo: float | None = None
    priority: int = 0          # higher bands first; < 0: sheddable
    tenant: str = DEFAULT_TENANT
    ttl: float | None = None   # seconds it may wait to start (daemon/core/queue_ttl.py)
    model: str = ""            # which of a multiplexed instance's models serves it


@dataclass(frozen=True, slots=True)
class FromInstance:
    now: float
    message: ToController


@dataclass(frozen=True, slots=True)
class SendFailed:
    """A Send could not be carried out. `unreachable`: the instance is gone (it died and
    the driver has not noticed yet); else the message itself could not be sent."""
    now: float
    instance_id: int
    message: ToInstance
    unreachable: bool = True


@dataclass(frozen=True, slots=True)
class InstanceDown:
    """An instance process exited; the driver restarts it (a new Ready follows)."""
    now: float
    instance_id: int
    exit_code: int | None = None


@dataclass(frozen=True, slots=True)
class ClientLeft:
    """The client is done with a request before its end (it left, or a stop string): the
    daemon sends it only for a request not settled yet."""
    now: float
    request_id: str
    outcome: Outcome = Outcome.CANCELLED


@dataclass(frozen=True, slots=True)
class Timer:
    kind: str   # "recovery" | "drain" | "overdue" | "ttl"
    key: int = 0


@dataclass(frozen=True, slots=True)
class TimerFired:
    now: float
    timer: Timer


@dataclass(frozen=True, slots=True)
class StartAccepting:
    """Every instance is ready: new requests may come."""
    now: float


@dataclass(frozen=True, slots=True)
class Drain:
    """Stop accepting; requests in flight may finish until now + timeout."""
    now: float
    timeout: float


Event = (Arrived | FromInstance | SendFailed | InstanceDown | ClientLeft | TimerFired
         | StartAccepting | Drain)


# ---- actions: core -> driver --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Send:
    instance_id: int
    message: ToInstance


class Tokens(msgspec.Struct, frozen=True):
    """Pass a step's tokens on to their clients: `tokens`, the instance's columns (less
    any of a request that had ended already), in order. For the driver's metrics,
    `ttfts` maps the position of each request's first token to its time to first token
    and `tbts` holds the gap before each other token, in order (seconds). One action per
    instance step, not one per token: a driver that streams hands each token to its
    request's stream (`tokens.output(i)`), the simulator's records take a step's
    tokens in one loop. It precedes every other action the step's tokens cause (the
    `Settle` of a request that got its last)."""
    tokens: StepTokens
    ttfts: dict[int, float] = {}
    tbts: list[float] = []


@dataclass(frozen=True, slots=True)
class Settle:
    """A request's last word: it ended with `outcome` (and `code`, `message` unless it
    completed). `instance`: the one that held it last; `e2e`: arrival to last token.
    `instances`, `offloaded`, `queue_delay`: where it went (`Tracked`), for the client's
    `serving_info` (ipc/serving_info.py) and the request log."""
    request_id: str
    outcome: Outcome
    code: EndCode | None = None
    message: str = ""
    instance: int | None = None
    e2e: float | None = None
    retry_after: int | None = None  # a dropped request: when to try again, seconds
    prompt_tokens: int = 0          # its prompt's tokens ...
    cached_tokens: int = 0          # ... and those its instance found in its prefix cache
    role: Role | None = None        # the role of the instance that gave its first token
    instances: tuple[int, ...] = ()  # every instance that held it, in order
    offloaded: bool = False         # moved off an LP before its prefill (offload, reroute)
    queue_delay: float | None = None  # arrival -> its prefill started; None: never started
    tenant: str = DEFAULT_TENANT    # who sent it
    output_tokens: int = 0          # tokens it was given
    ttft: float | None = None       # arrival to its first token


@dataclass(frozen=True, slots=True)
class Refuse:
    """A new request is not accepted (503); the client should retry after `retry_after` s."""
    request_id: str
    refusal: Refusal
    message: str
    retry_after: int


@dataclass(frozen=True, slots=True)
class Moved:
    """A request moved to another instance (`kind`: offload, rescue, resubmit, resume,
    reroute)."""
    request_id: str
    kind: Origin
    source: int | None
    target: int


@dataclass(frozen=True, slots=True)
class TicketOpened:
    instance_id: int


@dataclass(frozen=True, slots=True)
class StartTimer:
    """Send `TimerFired(now, timer)` at `at` or later, never before: the core ends only
    what is due at that `now` and does not arm the timer again."""
    timer: Timer
    at: float


@dataclass(frozen=True, slots=True)
class InstanceReady:
    """An instance serves (again): for the driver's supervisor and logs."""
    ready: Ready


@dataclass(frozen=True, slots=True)
class RoleSwitched:
    """An `<n>A` layout's instance changed role at `time` (docs/design.md §5.10), for
    `reason`; it gave back `returned` waiting requests, bound again from the waiting room."""
    instance_id: int
    old: Role
    new: Role
    reason: str
    time: float
    returned: int = 0


@dataclass(frozen=True, slots=True)
class EspChanged:
    """A request's ESP group (daemon/core/esp_groups.py) formed (`formed`: every member
    joined, the group's prefill goes ahead) or dissolved, for `reason`; `members`: its
    instances, the master first. For the driver's log, metrics and records."""
    request_id: str
    members: tuple[int, ...]
    formed: bool
    reason: str


Action = (Send | Tokens | Settle | Refuse | Moved | TicketOpened | StartTimer | InstanceReady
          | RoleSwitched | EspChanged)

"""One request's life in the controller: its state, the legal moves, and how it ends.

The core's ledger (daemon/core/ledger.py) keeps a `Tracked` per accepted request. Its
`state` changes only through `advance`, which looks the move up in `TRANSITIONS` (the
pattern of h11's `_state.py`: legal moves are data; an illegal one raises before anything
changes):

    PENDING ──bound──▶ QUEUED                  (late binding: it waited at the controller)
    QUEUED ──requeued──▶ PENDING               (an offload no HP can finish in time)
    QUEUED ──first token──▶ STREAMING          QUEUED ──offloaded──▶ QUEUED (on an HP)
    QUEUED / STREAMING ──holder lost──▶ MOVING  (its instance died: no instance holds it)
    STREAMING ──handed off──▶ STREAMING         (P/D: prefill instance -> decode instance)
    MOVING ──resubmitted──▶ QUEUED              MOVING ──resumed──▶ STREAMING
    any ──ended──▶ DONE                         (its one terminal answer: an `Outcome`)
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ipc.messages import Role, Submit
from policies.tenants import DEFAULT_TENANT


class RequestState(enum.Enum):
    PENDING = "pending"      # waiting at the controller; no instance holds it yet
    QUEUED = "queued"        # sent to an instance; no first token yet
    STREAMING = "streaming"  # its tokens flow to the client
    MOVING = "moving"        # its instance died; held by none until another takes it
    DONE = "done"            # answered; the core forgets it


class Trigger(enum.Enum):
    BOUND = "bound"
    REQUEUED = "requeued"
    FIRST_TOKEN = "first_token"
    OFFLOADED = "offloaded"
    HANDED_OFF = "handed_off"
    HOLDER_LOST = "holder_lost"
    RESUBMITTED = "resubmitted"
    RESUMED = "resumed"
    ENDED = "ended"


P, Q, S = RequestState.PENDING, RequestState.QUEUED, RequestState.STREAMING
M, D = RequestState.MOVING, RequestState.DONE
TRANSITIONS: dict[tuple[RequestState, Trigger], RequestState] = {
    (P, Trigger.BOUND): Q,
    (Q, Trigger.REQUEUED): P,
    (P, Trigger.ENDED): D,
    (Q, Trigger.FIRST_TOKEN): S,
    (Q, Trigger.OFFLOADED): Q,
    (Q, Trigger.HOLDER_LOST): M,
    (S, Trigger.HANDED_OFF): S,
    (S, Trigger.HOLDER_LOST): M,
    (M, Trigger.RESUBMITTED): Q,
    (M, Trigger.RESUMED): S,
    (Q, Trigger.ENDED): D,
    (S, Trigger.ENDED): D,
    (M, Trigger.ENDED): D,
}


class IllegalTransition(RuntimeError):
    """The core tried a move its table does not allow: a bug in the core, not the peer's."""


class Outcome(str, enum.Enum):
    """How a request ended, as the daemon counts it (`ascendra_requests_total{outcome}`)."""

    COMPLETED = "completed"  # its last token was sent (or the client stopped at a stop string)
    CANCELLED = "cancelled"  # the client left
    DROPPED = "dropped"      # given up on before its first token: its TTFT SLO was lost
    REJECTED = "rejected"    # an instance refused it (a 400)
    ERRORED = "errored"      # anything else: no instance could take it, drain timed out, ...


@dataclass(slots=True)
class Tracked:
    """The core's view of one accepted request."""

    request_id: str
    arrival_time: float
    submit: Submit                     # as last sent to an instance
    original: Submit                   # as first sent: what a recovery starts from
    state: RequestState = RequestState.QUEUED
    instance: int | None = None        # the instance that holds it; None while MOVING
    token_ids: list[int] = field(default_factory=list)  # every token passed on, in order
    first_token_time: float | None = None
    last_token_time: float | None = None
    #: Moved off an LP before its prefill started at least once (an offload, or a reroute:
    #: an offload no HP could take, back on an LP).
    offloaded: bool = False
    requeued: bool = False             # an LP gave it up and no HP could take it in time
    num_recoveries: int = 0            # times it was taken over from a dead instance
    give_up_time: float = float("inf")  # MOVING: end it if not placed by then
    why_moving: str = ""               # MOVING: what happened to its instance
    #: Prefix caching: the names of its prompt's full blocks, the prompt tokens each
    #: instance was known to hold at arrival (daemon/core/prefix_index.py), and those its
    #: serving instance found cached (reported when it was admitted there).
    block_names: list[bytes] = field(default_factory=list)
    cached_on: dict[int, int] = field(default_factory=dict)
    num_cached_tokens: int = 0
    #: The role of the instance that gave its first token, when it did (a `<n>A`
    #: layout's roles change: docs/design.md §5.10).
    served_as: Role | None = None
    #: Every instance that held it, in order: where it was bound (again, when a role
    #: change gave it back unstarted), then one more per move and P/D hand-off.
    instances: list[int] = field(default_factory=list)
    #: When its prefill first started on an instance, on the controller's clock: the
    #: end of the step that admitted it as received, less that step's length.
    prefill_start: float | None = None
    tenant: str = DEFAULT_TENANT       # who sent it (policies/tenants.py)

    def advance(self, trigger: Trigger) -> RequestState:
        """Take one move of the table; IllegalTransition (and no change) if there is none."""
        new = TRANSITIONS.get((self.state, trigger))
        if new is None:
            raise IllegalTransition(f"request {self.request_id}: no move from "
                                    f"{self.state.value} on {trigger.value}")
        self.state = new
        return new

    @property
    def waiting(self) -> bool:
        """It has no first token yet (it counts against the waiting-queue bounds)."""
        return self.first_token_time is None

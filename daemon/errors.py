"""The one error type the HTTP layer turns into an OpenAI-shaped JSON error."""
from __future__ import annotations

from daemon.core.events import Refuse, Settle
from daemon.core.request_state import Outcome
from ipc.api_codes import REFUSAL_CODES, EndCode


class ApiError(Exception):
    """`retry_after` (seconds) becomes a Retry-After header: set on 503s the client should
    retry later (a full waiting queue, no instance ready, the server shutting down)."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str] | None:
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None



# ---- the controller core's endings, as HTTP answers (ipc/api_codes.py has the codes) ------


def refusal_error(refused: Refuse) -> ApiError:
    """The 503 for a refused new request."""
    return ApiError(503, refused.message, REFUSAL_CODES[refused.refusal],
                    retry_after=refused.retry_after)


def settle_error(settled: Settle) -> ApiError | None:
    """The error a request's stream ends with; None when it completed or the client itself
    left. An instance's refusal is the client's 400; a lost request a 503 (a 500 only when
    the message could not be sent at all)."""
    if settled.outcome in (Outcome.COMPLETED, Outcome.CANCELLED):
        return None
    if settled.outcome is Outcome.REJECTED:
        return ApiError(400, settled.message)
    code = settled.code.value if settled.code is not None else None
    return ApiError(500 if settled.code is EndCode.INTERNAL else 503, settled.message, code,
                    retry_after=settled.retry_after)

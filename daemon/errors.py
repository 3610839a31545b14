"""The one error type the HTTP layer turns into an OpenAI-shaped JSON error."""
from __future__ import annotations


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

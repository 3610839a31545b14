"""The one error type the HTTP layer turns into an OpenAI-shaped JSON error."""
from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code

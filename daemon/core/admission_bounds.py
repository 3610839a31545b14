"""Admission bounds: how many requests (and prompt tokens) may wait for a first token.

The controller counts every request it has accepted and that has no first token yet --
waiting in an instance's queue, on its way there, or waiting to be taken over after an
instance died -- and the prompt tokens they carry. A new request that would take either
count past its limit (`max_queued_requests`, `max_queued_tokens`) is refused at once with
503 and a `Retry-After` header, rather than queued: under any overload the daemon's memory
stays bounded and a client learns quickly that it should come back.

Behind an inference gateway (docs/gateway_protocol.md) that quick 503 is what lets the
gateway send the request to another box: Envoy's `5xx` and `gateway-error` retry
policies cover 503 (a 429 would have to be listed among its retriable status codes), and
`Retry-After` tells a client without a gateway when to come back.
"""
from __future__ import annotations

import math


class AdmissionBounds:
    """The counts, kept as requests come and go (the core's ledger calls `add` on accept
    and `remove` once when a request gets its first token or ends without one)."""

    def __init__(self, max_requests: int, max_tokens: int) -> None:
        self.max_requests = max_requests
        self.max_tokens = max_tokens
        self.requests = 0
        self.tokens = 0

    def refusal(self, num_tokens: int) -> str | None:
        """Why a request of `num_tokens` prompt tokens cannot wait now, or None if it can."""
        if self.requests + 1 > self.max_requests:
            return (f"the server is overloaded: {self.requests} requests are waiting for a "
                    f"first token (max_queued_requests = {self.max_requests}); retry later")
        if self.tokens + num_tokens > self.max_tokens:
            return (f"the server is overloaded: {self.tokens} prompt tokens are waiting and this "
                    f"request has {num_tokens} (max_queued_tokens = {self.max_tokens}); "
                    "retry later")
        return None

    def add(self, num_tokens: int) -> None:
        self.requests += 1
        self.tokens += num_tokens

    def remove(self, num_tokens: int) -> None:
        self.requests = max(0, self.requests - 1)
        self.tokens = max(0, self.tokens - num_tokens)


#: Retry-After (seconds) while no instance is ready: they come back within their restart
#: backoff, and a gateway sends the retry to another box at once anyway.
RESTARTING_RETRY_AFTER = 1


def retry_after(ttft_slo: float) -> int:
    """Seconds a refused client should wait (the Retry-After header): about one TTFT
    target, by when the requests that filled the queue have started or left; at least 1."""
    return max(1, math.ceil(ttft_slo))

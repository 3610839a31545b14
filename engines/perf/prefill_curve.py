"""Predicted prefill seconds from an instance's reported curve: (tokens, seconds) points
of its performance model, interpolated linearly between them and extrapolated in
proportion past the last (prefill time grows at least linearly with the prompt).

An instance without a model (sarathi, vllm) reports no curve; then a prompt costs
`FALLBACK_SECONDS_PER_TOKEN` each token -- about an 8B model's prefill rate on an A100 --
so that plans still weigh requests by their length."""
from __future__ import annotations

import bisect
from collections.abc import Sequence


FALLBACK_SECONDS_PER_TOKEN = 1e-4


def curve_seconds(curve: Sequence[tuple[int, float]], tokens: int) -> float:
    """Seconds to prefill `tokens` prompt tokens (see the module docstring)."""
    if tokens <= 0:
        return 0.0
    if not curve:
        return tokens * FALLBACK_SECONDS_PER_TOKEN
    lengths = [n for n, _ in curve]
    i = bisect.bisect_left(lengths, tokens)
    if i == 0:
        n, seconds = curve[0]
        return seconds * tokens / n
    if i == len(curve):
        n, seconds = curve[-1]
        return seconds * tokens / n
    (n0, s0), (n1, s1) = curve[i - 1], curve[i]
    return s0 + (s1 - s0) * (tokens - n0) / (n1 - n0)

"""One request header that has several names (llm-d's current name and its deprecated
aliases, ipc/tenancy.py, daemon/slo_headers.py): which one counts, and its values."""
from __future__ import annotations


def values_of(headers, name: str) -> list[str]:
    """Every value of `name` (aiohttp's multidict, or a plain mapping: at most one)."""
    if hasattr(headers, "getall"):
        return headers.getall(name, [])
    return [headers[name]] if name in headers else []


def first_named(headers, names: tuple[str, ...]) -> tuple[str, list[str]]:
    """The first of `names` the request carries and its values; (names[0], []) when it
    carries none. The current name wins over an alias sent beside it."""
    for name in names:
        values = values_of(headers, name)
        if values:
            return name, values
    return names[0], []

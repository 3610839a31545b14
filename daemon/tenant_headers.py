"""Who is asking, and in which priority band: a request's tenant and priority from its
body and headers (docs/api.md, "Tenants and priority").

Tenant: the `x-llm-d-inference-fairness-id` header (llm-d's flow-control key; its old
name `x-gateway-inference-fairness-id` too, the new one winning), else the body's
`user` (OpenAI's end-user id), else "default".

Priority: the body's `priority` when given, else the `x-ascendra-priority` header (a
gateway route can set it), else the priority the operator gave the request's
Inference Extension objective (`x-llm-d-inference-objective`, or its old name
`x-gateway-inference-objective`, mapped by
[tenants] objective_priorities as its InferenceObjective's `priority`), else 0. The
same sign rule as the InferenceObjective's: higher is served first, negative is
sheddable. A malformed header is the client's 400, naming it.
"""
from __future__ import annotations

import re

import msgspec

from daemon.core.controller_config import TenantsConfig
from daemon.header_aliases import first_named
from ipc.tenancy import (
    MAX_PRIORITY,
    MIN_PRIORITY,
    OBJECTIVE_HEADERS,
    PRIORITY_HEADER,
    TENANT_HEADERS,
)
from policies.tenants import DEFAULT_TENANT

MAX_TENANT_LEN = 256   # the header's; OpenAI's `user` has no limit, and none is set here
_INTEGER = re.compile(r"[+-]?\d{1,4}")


class BadIdentityHeader(ValueError):
    """A malformed tenant or priority header; `param` names it (the 400's `param`)."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"{name}: {why}")
        self.param = name


class Identity(msgspec.Struct, frozen=True):
    tenant: str = DEFAULT_TENANT
    priority: int = 0


def identity(body, headers, tenants: TenantsConfig) -> Identity:
    """The tenant and priority of `body` (a request struct with `user` and `priority`)
    sent with `headers` (aiohttp's multidict or a plain mapping)."""
    name, header = _one(headers, TENANT_HEADERS)
    if header is not None and (len(header) > MAX_TENANT_LEN or not header.isprintable()):
        raise BadIdentityHeader(name, f"a tenant is at most {MAX_TENANT_LEN} "
                                               "printable characters")
    return Identity(header or body.user or DEFAULT_TENANT, _priority(body, headers, tenants))


def _priority(body, headers, tenants: TenantsConfig) -> int:
    if body.priority is not None:
        return body.priority
    _, text = _one(headers, (PRIORITY_HEADER,))
    if text is not None:
        if not _INTEGER.fullmatch(text) or not MIN_PRIORITY <= int(text) <= MAX_PRIORITY:
            raise BadIdentityHeader(PRIORITY_HEADER, f"{text!r} is not an integer in "
                                                     f"[{MIN_PRIORITY}, {MAX_PRIORITY}]")
        return int(text)
    _, objective = _one(headers, OBJECTIVE_HEADERS)
    return tenants.objective_priorities.get(objective, 0) if objective else 0


def _one(headers, names: tuple[str, ...]) -> tuple[str, str | None]:
    """The first of `names` the request carries and its value, stripped (None if absent
    or empty). Sent twice with different values: a 400."""
    name, values = first_named(headers, names)
    if len({v.strip() for v in values}) > 1:
        raise BadIdentityHeader(name, f"sent {len(values)} times with different values")
    return name, (values[0].strip() or None) if values else None

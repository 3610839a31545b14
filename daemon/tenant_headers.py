"""Who is asking, and in which priority band: a request's tenant and priority from its
body and headers (docs/api.md, "Tenants and priority").

Tenant: the `x-gateway-inference-fairness-id` header (the Gateway API Inference
Extension's flow-control key, which llm-d's endpoint picker sets), else the body's
`user` (OpenAI's end-user id), else "default".

Priority: the body's `priority` when given, else the `x-ascendra-priority` header (a
gateway route can set it), else the priority the operator gave the request's
Inference Extension objective (`x-gateway-inference-objective`, mapped by
[tenants] objective_priorities as its InferenceObjective's `priority`), else 0. The
same sign rule as the InferenceObjective's: higher is served first, negative is
sheddable. A malformed header is the client's 400, naming it.
"""
from __future__ import annotations

import re

import msgspec

from daemon.core.controller_config import TenantsConfig
from ipc.tenancy import (
    MAX_PRIORITY,
    MIN_PRIORITY,
    OBJECTIVE_HEADER,
    PRIORITY_HEADER,
    TENANT_HEADER,
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
    header = _one(headers, TENANT_HEADER)
    if header is not None and (len(header) > MAX_TENANT_LEN or not header.isprintable()):
        raise BadIdentityHeader(TENANT_HEADER, f"a tenant is at most {MAX_TENANT_LEN} "
                                               "printable characters")
    return Identity(header or body.user or DEFAULT_TENANT, _priority(body, headers, tenants))


def _priority(body, headers, tenants: TenantsConfig) -> int:
    if body.priority is not None:
        return body.priority
    text = _one(headers, PRIORITY_HEADER)
    if text is not None:
        if not _INTEGER.fullmatch(text) or not MIN_PRIORITY <= int(text) <= MAX_PRIORITY:
            raise BadIdentityHeader(PRIORITY_HEADER, f"{text!r} is not an integer in "
                                                     f"[{MIN_PRIORITY}, {MAX_PRIORITY}]")
        return int(text)
    objective = _one(headers, OBJECTIVE_HEADER)
    return tenants.objective_priorities.get(objective, 0) if objective else 0


def _one(headers, name: str) -> str | None:
    """The header's value, stripped; None if absent or empty. Sent twice with different
    values: a 400."""
    values = headers.getall(name, []) if hasattr(headers, "getall") else (
        [headers[name]] if name in headers else [])
    if len({v.strip() for v in values}) > 1:
        raise BadIdentityHeader(name, f"sent {len(values)} times with different values")
    return (values[0].strip() or None) if values else None

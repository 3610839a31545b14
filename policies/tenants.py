"""Tenants' fair shares (docs/design.md §5.11).

DEFAULT_TENANT names the tenant of a request that says nothing of who sent it."""
from __future__ import annotations

DEFAULT_TENANT = "default"

"""The wire contract of tenants and priority bands, shared by the daemon's HTTP side
(daemon/tenant_headers.py) and the load generator (bench/loadgen/): the headers a
request names them in, and the band limits (docs/api.md, "Tenants and priority").

The header names are llm-d's router's (`pkg/epp/metadata/consts.go` in llm-d/llm-d-router:
`FlowFairnessIDKey`, `ObjectiveKey`, `InferenceTTLHeaderKey`); each `*_HEADERS` tuple is
the current name first, then the deprecated alias the router still accepts
(`x-gateway-*`). When a request carries both, the first of the tuple wins, as in the
router's `GetLowerCaseHeaderValue`.
"""
from __future__ import annotations

#: Who is asking: the flow-control fairness key (llm-d's; the Gateway API Inference
#: Extension's old name after it).
TENANT_HEADER = "x-llm-d-inference-fairness-id"
TENANT_HEADERS = (TENANT_HEADER, "x-gateway-inference-fairness-id")
#: A request's priority band, when its body gives none (a gateway route can set it).
PRIORITY_HEADER = "x-ascendra-priority"
#: The InferenceObjective a gateway matched the request to ([tenants] objective_priorities).
OBJECTIVE_HEADER = "x-llm-d-inference-objective"
OBJECTIVE_HEADERS = (OBJECTIVE_HEADER, "x-gateway-inference-objective")
#: How long the request may wait for its first token (a Go duration, "1500ms"): llm-d's
#: per-request flow-control queue TTL.
TTL_HEADER = "x-llm-d-inference-ttl"
#: Sent back on every answer that got past admission: integer ms from arrival to the
#: start of its prefill (llm-d's `FlowQueueDurationHeaderKey`).
QUEUE_DURATION_HEADER = "x-llm-d-flow-queue-duration-ms"
#: Priority bands: higher first; below 0, sheddable.
MIN_PRIORITY, MAX_PRIORITY = -100, 100

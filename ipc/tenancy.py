"""The wire contract of tenants and priority bands, shared by the daemon's HTTP side
(daemon/tenant_headers.py) and the load generator (bench/loadgen/): the headers a
request names them in, and the band limits (docs/api.md, "Tenants and priority")."""
from __future__ import annotations

#: Who is asking: the Gateway API Inference Extension's flow-control key.
TENANT_HEADER = "x-gateway-inference-fairness-id"
#: A request's priority band, when its body gives none (a gateway route can set it).
PRIORITY_HEADER = "x-ascendra-priority"
#: The InferenceObjective a gateway matched the request to ([tenants] objective_priorities).
OBJECTIVE_HEADER = "x-gateway-inference-objective"
#: Priority bands: higher first; below 0, sheddable.
MIN_PRIORITY, MAX_PRIORITY = -100, 100

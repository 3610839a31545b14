"""What an inference gateway sees of the box: the model-server protocol's load signals.

The Gateway API Inference Extension's endpoint picker (and llm-d's inference scheduler)
scores each model server by a few Prometheus gauges named after vLLM's
(docs/gateway_protocol.md). A box of several instances behind one controller is one
endpoint, so the values are the box's, computed here from the controller core's state
alone -- no clock, no I/O -- so the daemon's /metrics (daemon/metrics.py) and the
simulator (bench/sim/simulator.py drives the same core) show a gateway the same numbers:

* running: per ready instance, the requests in its batch as of its latest report (a
  step's load or a heartbeat), capped by the requests the controller knows it holds;
* waiting: every other request the box has accepted and not ended -- in the
  controller's waiting room, on their way to an instance, being moved after an
  instance died or an LP offloaded them, and in an instance's queue (preempted ones
  included, as in vLLM). So waiting + running = requests in flight, at every moment;
* KV-cache usage: KV blocks in use over KV blocks in total, across the ready
  instances (0 to 1; 0 while none is ready).
"""
from __future__ import annotations

import msgspec

from daemon.core.core_view import CoreView
from daemon.core.ledger import InstanceView


class GatewayView(msgspec.Struct, frozen=True, kw_only=True):
    num_requests_waiting: int   # vllm:num_requests_waiting
    num_requests_running: int   # vllm:num_requests_running
    kv_cache_usage_perc: float  # vllm:kv_cache_usage_perc, 0..1
    block_size: int             # vllm:cache_config_info{block_size}; 0: no instance ready
    num_gpu_blocks: int         # vllm:cache_config_info{num_gpu_blocks}: the box's KV blocks


def gateway_view(core: CoreView) -> GatewayView:
    ready = [view for view in core.instances.values() if view.ready is not None]
    running = sum(_running(view) for view in ready)
    total_blocks = sum(view.ready.num_kv_blocks for view in ready)
    used_blocks = sum(min(view.num_kv_blocks_used, view.ready.num_kv_blocks) for view in ready)
    return GatewayView(
        num_requests_waiting=max(0, core.requests_in_flight - running),
        num_requests_running=running,
        kv_cache_usage_perc=used_blocks / total_blocks if total_blocks else 0.0,
        block_size=max((view.ready.block_size for view in ready), default=0),
        num_gpu_blocks=total_blocks)


def _running(view: InstanceView) -> int:
    """Its batch as last reported, no larger than what it holds now (a request the
    controller has ended -- a client that left -- leaves its batch only at its next step)."""
    return min(view.num_running, len(view.held))

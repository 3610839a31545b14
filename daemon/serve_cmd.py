"""`ascendra serve`: the daemon -- instances, controller, HTTP API, systemd integration.

Lifecycle: start every instance and wait until all are ready; open the HTTP port;
tell systemd READY=1 and keep sending WATCHDOG=1 while healthy. On SIGTERM/SIGINT:
STOPPING=1, refuse new requests (503), let in-flight ones finish for up to
`drain_timeout`, stop the instances, exit 0.
"""
from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import signal
from pathlib import Path

import uvloop
from aiohttp import web

from daemon.api import API_KEY_ENV, build_app, resolve_api_key
from daemon.config import ServeConfig, add_config_flags, config_from_args
from daemon.controller import Controller
from daemon.layout import InstanceSpec, parse_layout
from daemon.systemd import Notifier
from engines.executors.config import ExecutorConfig
from engines.instance_config import InstanceConfig
from engines.models.builtin import builtin_tiny_model_dir
from engines.models.tokenizer import Tokenizer
from engines.scheduler_config import SchedulerConfig
from ipc.channel import ControllerChannel, make_runtime_dir

log = logging.getLogger("ascendra")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the daemon: OpenAI-compatible HTTP API over engine instances")
    p.add_argument("--config", help="TOML config file; flags override its fields")
    add_config_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return uvloop.run(serve(config))


def instance_configs(config: ServeConfig, endpoint: str, model_dir: Path) -> list[InstanceConfig]:
    specs = parse_layout(config.layout, config.gpus or None, config.gpus_per_instance)
    return [_instance_config(config, spec, endpoint, model_dir) for spec in specs]


def _instance_config(config: ServeConfig, spec: InstanceSpec, endpoint: str,
                     model_dir: Path) -> InstanceConfig:
    scheduler = SchedulerConfig(mode=spec.mode, chunk_size=config.chunk_size,
                                max_num_seqs=config.max_num_seqs,
                                value_function=config.value_function,
                                offload_threshold=config.offload_threshold,
                                drop_expired=config.drop_expired)
    executor = ExecutorConfig(kind=config.executor, block_size=config.block_size,
                              num_kv_blocks=config.num_kv_blocks, model_dir=str(model_dir),
                              device=config.device, latency=config.resolved_sim_latency)
    return InstanceConfig(instance_id=spec.index, endpoint=endpoint, scheduler=scheduler.validate(),
                          executor=executor, gpus=list(spec.gpus) if spec.gpus else None,
                          heartbeat_interval=config.heartbeat_interval, log_level=config.log_level)


async def serve(config: ServeConfig) -> int:
    model_dir = Path(config.model) if config.model else builtin_tiny_model_dir()
    tokenizer = Tokenizer(model_dir)
    channel = ControllerChannel(make_runtime_dir(config.runtime_dir or None))
    controller = Controller(
        channel, instance_configs(config, channel.endpoint, model_dir), tokenizer=tokenizer,
        model_name=config.served_model_name or model_dir.name, ttft_slo=config.ttft_slo,
        tbt_slo=config.tbt_slo, backoff_max=config.restart_backoff_max,
        max_queued_requests=config.max_queued_requests,
        max_queued_tokens=config.max_queued_tokens, recovery_timeout=config.recovery_timeout)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await controller.start()
    except RuntimeError as exc:
        log.error("could not start: %s", exc)
        await controller.stop()
        return 1
    api_key = resolve_api_key(config)
    if not api_key and not _is_loopback(config.host):
        log.warning("listening on %s without an API key: anyone who can reach the port can "
                    "use the model (set --api-key or $%s)", config.host, API_KEY_ENV)
    runner = web.AppRunner(build_app(controller, config, api_key),
                           handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    port = runner.addresses[0][1]
    log.info("serving %s on http://%s:%d (layout %s, %s executor)", controller.model_name,
             config.host, port, config.layout, config.executor)
    notifier = Notifier()
    notifier.ready(f"serving on port {port}")
    watchdog = asyncio.create_task(_watchdog(notifier, controller))
    await stop.wait()
    log.info("stopping: draining requests for up to %.0f s", config.drain_timeout)
    notifier.stopping()
    watchdog.cancel()
    await controller.drain(config.drain_timeout)
    await runner.cleanup()
    await controller.stop()
    log.info("stopped")
    return 0


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


async def _watchdog(notifier: Notifier, controller: Controller) -> None:
    """WATCHDOG=1 while at least one instance serves; silence lets systemd restart us."""
    if notifier.watchdog_interval is None:
        return
    while True:
        await asyncio.sleep(notifier.watchdog_interval)
        if controller.supervisor.ready_ids():
            notifier.watchdog()

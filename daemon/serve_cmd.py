"""`ascendra serve`: the daemon -- instances, controller, HTTP API, systemd integration.

One controller per served model, each over its model's instance group and with its own
socket in the runtime directory (daemon/model_plan.py, daemon/served_models.py).
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
import os
import signal
from pathlib import Path

import msgspec
import uvloop
from aiohttp import web

from daemon.api import API_KEY_ENV, build_app, resolve_api_key
from daemon.config import ServeConfig, add_config_flags, config_from_args
from daemon.config_toml import render_toml
from daemon.controller import Controller
from daemon.http_guard import ConnectionGuard
from daemon.layout import InstanceSpec, dynamic_roles
from daemon.model_plan import ModelPlan
from daemon.served_models import ServedModels
from daemon.slo_defaults import latency_slo_scale
from daemon.systemd import Notifier
from engines.executors.executor_config import ExecutorConfig
from engines.models.model_config import ModelConfig as ModelShape
from engines.models.tensor_parallel import check_divisible
from engines.gc_freeze import freeze_startup_heap
from engines.instance_config import InstanceConfig, MuxModelConfig
from engines.models.builtin import builtin_tiny_model_dir
from engines.models.tokenizer import Tokenizer
from ipc.channel import CONTROLLER_SOCKET, ControllerChannel, make_runtime_dir

log = logging.getLogger("ascendra")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML config file; flags override its fields")
    p.add_argument("--print-config", action="store_true",
                   help="print the config (the file and flags applied) as commented TOML and exit")
    add_config_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if args.print_config:
        print(render_toml(config), end="")
        return 0
    for plan in config.model_plans():
        if plan.tp > 1:  # (the tiny model is made only when asked for)
            _check_tp(plan, _model_dir(plan))
    logging.basicConfig(level=config.process.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    scale = latency_slo_scale(config.instances.resolved_sim_latency, config.instances.slo_scale)
    if scale.basis:  # the model's own SLOs (daemon/slo_defaults.py), said once at start
        log.info("%s: default ttft_slo %g s, tbt_slo %g s", scale.describe(),
                 config.slo.ttft_slo, config.slo.tbt_slo)
    return uvloop.run(serve(config))


def instance_configs(config: ServeConfig, plan: ModelPlan, endpoint: str,
                     model_dir: Path) -> list[InstanceConfig]:
    models = [MuxModelConfig(name=name, model_dir=str(Path(folder) if folder
                                                      else builtin_tiny_model_dir()))
              for name, folder in plan.multiplexed]
    return [msgspec.structs.replace(_instance_config(config, spec, endpoint, model_dir, plan.tp),
                                    models=models)
            for spec in plan.instances]


def build_controller(config: ServeConfig, plan: ModelPlan, runtime_dir: Path,
                     socket: str) -> Controller:
    """One model's (or multiplexed group's) controller: its tokenizer, its socket, its
    instance group."""
    model_dir = _model_dir(plan)
    tokenizer = Tokenizer(model_dir)
    _check_one_tokenizer(plan, tokenizer)
    channel = ControllerChannel(runtime_dir, name=socket)
    return Controller(
        channel, instance_configs(config, plan, channel.endpoint, model_dir),
        tokenizer=tokenizer, model_name=plan.label, model_names=plan.names, slo=config.slo,
        controller_config=config.controller, backoff_max=config.process.restart_backoff_max,
        request_log=config.process.request_log, dynamic_roles=dynamic_roles(plan.layout),
        tenants=config.tenants)


def _check_one_tokenizer(plan: ModelPlan, tokenizer: Tokenizer) -> None:
    """A multiplexed group's models share their first model's tokenizer (one controller
    tokenizes for all of them): ValueError naming model.placement when one differs."""
    for name, folder in plan.multiplexed[1:]:
        other = Tokenizer(Path(folder) if folder else builtin_tiny_model_dir())
        if other.to_json() != tokenizer.to_json():
            raise ValueError(f"model.placement: {name!r} is multiplexed with {plan.name!r} but "
                             "its tokenizer differs; multiplexed models must share one")


def _check_tp(plan: ModelPlan, model_dir: Path) -> None:
    """ValueError naming instances.tp when the model cannot be split over its degree."""
    if (model_dir / "config.json").is_file():
        check_divisible(ModelShape.from_pretrained(model_dir), plan.tp, "instances.tp")


def _model_dir(plan: ModelPlan) -> Path:
    return Path(plan.folder) if plan.folder else builtin_tiny_model_dir()


def _socket_name(index: int) -> str:
    """The first model's socket is the single-model daemon's; the others are numbered."""
    return CONTROLLER_SOCKET if index == 0 else f"controller-{index}.sock"


def _instance_config(config: ServeConfig, spec: InstanceSpec, endpoint: str,
                     model_dir: Path, tp: int = 1) -> InstanceConfig:
    scheduler = msgspec.structs.replace(config.scheduler, mode=spec.mode)
    instances = config.instances
    executor = ExecutorConfig(kind=instances.executor, block_size=instances.block_size,
                              num_kv_blocks=instances.num_kv_blocks, model_dir=str(model_dir),
                              device=instances.device, latency=instances.resolved_sim_latency,
                              max_model_len=config.model.max_model_len,
                              cuda_graph_max_batch=min(instances.cuda_graph_max_batch,
                                                       scheduler.resolved_max_num_seqs()),
                              tp=tp, perf_profile=instances.perf_profile,
                              torch_threads=instances.torch_threads,
                              esp=config.controller.esp_max_degree > 1)
    return InstanceConfig(instance_id=spec.index, endpoint=endpoint, scheduler=scheduler.validate(),
                          executor=executor, gpus=list(spec.gpus) if spec.gpus else None,
                          heartbeat_interval=config.process.heartbeat_interval,
                          log_level=config.process.log_level,
                          step_log=_step_log(instances.step_log, spec.index))


def _step_log(folder: str, index: int) -> str:
    """Instance `index`'s step log in `folder` (instances.step_log); "" when off."""
    return str(Path(folder).absolute() / f"steps-{index}.jsonl") if folder else ""


async def serve(config: ServeConfig) -> int:
    http = config.http
    taken = await _port_taken(http.host, http.port)
    if taken:
        log.error("cannot listen on %s:%d: %s", http.host, http.port, taken)
        return 1
    runtime_dir = make_runtime_dir(config.process.runtime_dir or None)
    plans = config.model_plans()
    models = ServedModels([build_controller(config, plan, runtime_dir, _socket_name(i))
                           for i, plan in enumerate(plans)])
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await models.start()
    except RuntimeError as exc:
        log.error("could not start: %s", exc)
        await models.stop()
        return 1
    api_key = resolve_api_key(http)
    if not api_key and not _is_loopback(http.host):
        log.warning("listening on %s without an API key: anyone who can reach the port can "
                    "use the model (set --api-key or $%s)", http.host, API_KEY_ENV)
    guard = ConnectionGuard(http.header_timeout, http.body_timeout, http.max_connections)
    app = build_app(models, http, api_key)
    app.middlewares.append(guard.middleware)  # innermost: after the API key check
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        await guard.site(runner, http.host, http.port).start()
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", http.host, http.port, _why(exc))
        await runner.cleanup()
        await models.stop()
        return 1
    port = runner.addresses[0][1]
    if http.port_file:
        try:
            _write_port_file(http.port_file, port)
        except OSError as exc:
            log.error("cannot write the port file %s: %s", http.port_file, _why(exc))
            await runner.cleanup()
            await models.stop()
            return 1
    log.info("serving %s on http://%s:%d (layout %s, %s executor)", ", ".join(models.names),
             http.host, port, "+".join(p.layout for p in plans), config.instances.executor)
    for plan in plans:
        log.info("model %s on instances %s; model and tokenizer folder: %s (load testers take "
                 "it as their tokenizer)", plan.label,
                 ", ".join(str(spec.index) for spec in plan.instances), _model_dir(plan))
    freeze_startup_heap()  # never to be scanned again by the garbage collector
    notifier = Notifier()
    notifier.ready(f"serving on port {port}")
    watchdog = asyncio.create_task(_watchdog(notifier, models))
    await stop.wait()
    log.info("stopping: draining requests for up to %.0f s", config.process.drain_timeout)
    notifier.stopping()
    watchdog.cancel()
    await models.drain(config.process.drain_timeout)
    await runner.cleanup()
    await models.stop()
    if http.port_file:
        Path(http.port_file).unlink(missing_ok=True)
    _remove_runtime_dir(runtime_dir, chosen=bool(config.process.runtime_dir))
    log.info("stopped")
    return 0


def _remove_runtime_dir(path: Path, chosen: bool) -> None:
    """The sockets' directory when this run made it (not `runtime_dir`) and nothing is
    left in it: a clean stop leaves no /tmp/ascendra-XXXX behind."""
    if chosen:
        return
    try:
        path.rmdir()
    except OSError:  # not empty (something else put a file there), or already gone
        pass


def _write_port_file(path: str, port: int) -> None:
    """The port, one line, written whole: a reader never sees half of it."""
    target = Path(path)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    partial.write_text(f"{port}\n")
    os.replace(partial, target)


async def _port_taken(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on (e.g. another daemon has it), or None.
    Checked before any instance starts, so a taken port fails in a moment."""
    if port == 0:
        return None
    loop = asyncio.get_running_loop()
    try:
        probe = await loop.create_server(asyncio.Protocol, host, port, reuse_address=True)
    except OSError as exc:
        return _why(exc)
    probe.close()
    await probe.wait_closed()
    return None


def _why(exc: OSError) -> str:
    """"address already in use", not asyncio's sentence around it."""
    return os.strerror(exc.errno).lower() if exc.errno else str(exc)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


async def _watchdog(notifier: Notifier, models: ServedModels) -> None:
    """WATCHDOG=1 while each model has an instance that serves; silence lets systemd
    restart us."""
    if notifier.watchdog_interval is None:
        return
    while True:
        await asyncio.sleep(notifier.watchdog_interval)
        if models.serving():
            notifier.watchdog()

"""Entry point of one instance process: `python -m engines.instance_main --config-json JSON`.

Start it with engines.instance_launch (which sets CUDA_VISIBLE_DEVICES and the parent
pid); the controller must have bound its ControllerChannel at the config's endpoint.
SIGTERM and SIGINT end the process cleanly with exit code 0.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from engines.instance_config import InstanceConfig

log = logging.getLogger("engines.instance")


class Terminated(BaseException):
    """Raised from the SIGTERM/SIGINT handler to unwind the loop (a BaseException, so the
    loop's error handling does not mistake it for a failure)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engines.instance_main")
    parser.add_argument("--config-json", required=True, help="an InstanceConfig as JSON")
    args = parser.parse_args(argv)
    try:
        config = InstanceConfig.from_json(args.config_json)
    except ValueError as exc:
        print(f"instance: error: {exc}", file=sys.stderr)
        return 2
    pin_gpus(config)  # before anything can import torch
    setup_logging(config)
    _install_signal_handlers()
    try:
        return serve(config)
    except Terminated:
        log.info("instance %d: terminated by signal", config.instance_id)
        return 0


def pin_gpus(config: InstanceConfig) -> None:
    if config.gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, config.gpus))


def setup_logging(config: InstanceConfig) -> None:
    logging.basicConfig(
        level=config.log_level.upper(), stream=sys.stderr,
        format=f"%(asctime)s instance-{config.instance_id} %(levelname)s %(name)s: %(message)s")


def serve(config: InstanceConfig) -> int:
    """Connect, build the executor and its performance model (reporting a failure to the
    controller), run the loop."""
    from engines.executors.build import build_executor
    from engines.gc_freeze import freeze_startup_heap
    from engines.instance import EXIT_FAILED, Instance
    from engines.perf_setup import build_perf_model
    from ipc.channel import InstanceChannel
    from ipc.messages import InstanceFailed

    channel = InstanceChannel(config.endpoint, config.instance_id)
    try:
        try:
            if config.models:  # several models on one device (engines/mux_core.py)
                from engines.mux_build import build_mux_instance
                core, executor = build_mux_instance(config)
                instance = Instance(config, executor, channel, core=core)
            else:
                executor = build_executor(config.executor)
                perf_model = build_perf_model(executor, config.executor, config.scheduler)
                instance = Instance(config, executor, channel, perf_model)
        except Exception as exc:
            log.exception("instance %d: could not build the instance", config.instance_id)
            channel.send(InstanceFailed(instance_id=config.instance_id,
                                        message=f"{type(exc).__name__}: {exc}"))
            return EXIT_FAILED
        freeze_startup_heap()  # the start-up heap, never to be scanned again (engines/gc_freeze.py)
        return instance.run()
    finally:
        channel.close()


def _install_signal_handlers() -> None:
    def stop(signum, frame):
        raise Terminated(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


if __name__ == "__main__":
    sys.exit(main())

"""`ascendra chaos`: load and faults against a real daemon (sim executor); see bench/chaos/chaos_run.py."""
from __future__ import annotations

import argparse
import json
import shlex

from bench.chaos.chaos_run import ChaosConfig, format_tally, run_chaos


def _range(text: str) -> tuple[int, int]:
    low, _, high = text.partition(":")
    try:
        lo, hi = int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW:HIGH, got {text!r}") from None
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"expected 1 <= LOW <= HIGH, got {text!r}")
    return lo, hi


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = ChaosConfig()
    p.description = ("Start `ascendra serve --executor sim` as a subprocess, drive open-loop "
                     "streaming load and inject faults; print the tally: accepted, completed, "
                     "dropped by reason, errored by message, client-cancelled, lost (must be "
                     "0).")
    p.add_argument("--duration", type=float, default=d.duration,
                   help="seconds of load before the SIGTERM (default %(default)s)")
    p.add_argument("--qps", type=float, default=d.qps,
                   help="arrivals per second (default %(default)s)")
    p.add_argument("--layout", default=d.layout, help="daemon layout (default %(default)s)")
    p.add_argument("--sim-latency", default=d.sim_latency, help="default %(default)s")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--prompt-len", type=_range, default=d.prompt_len, metavar="LOW:HIGH",
                   help="prompt tokens, uniform (default 16:256)")
    p.add_argument("--output-len", type=_range, default=d.output_len, metavar="LOW:HIGH",
                   help="output tokens, uniform (default 8:96)")
    p.add_argument("--cancel-fraction", type=float, default=d.cancel_fraction,
                   help="share of clients that disconnect mid-stream (default %(default)s)")
    p.add_argument("--burst", type=int, default=d.burst,
                   help="requests sent at once at 70%% of the run (default %(default)s)")
    p.add_argument("--max-queued-requests", type=int, default=d.max_queued_requests,
                   help="the daemon's waiting-queue bound (default %(default)s)")
    p.add_argument("--drain-timeout", type=float, default=d.drain_timeout,
                   help="the daemon's drain timeout after SIGTERM (default %(default)s)")
    p.add_argument("--model", default="", help="model folder whose tokenizer the daemon loads "
                                               "(default: the built-in tiny model)")
    p.add_argument("--no-faults", dest="faults", action="store_false",
                   help="inject nothing but the final SIGTERM (an overload or soak run)")
    p.add_argument("--serve-args", default="", metavar="'FLAGS'",
                   help="more `ascendra serve` flags, e.g. \"--max-num-seqs 8\"")
    p.add_argument("--log", default="", help="write the daemon's log here")
    p.add_argument("--json", metavar="PATH", help="write the tally as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.duration <= 0 or args.qps <= 0:
        raise ValueError("--duration and --qps must be positive")
    cfg = ChaosConfig(duration=args.duration, qps=args.qps, layout=args.layout,
                      sim_latency=args.sim_latency, seed=args.seed, prompt_len=args.prompt_len,
                      output_len=args.output_len, cancel_fraction=args.cancel_fraction,
                      burst=args.burst, max_queued_requests=args.max_queued_requests,
                      drain_timeout=args.drain_timeout, model=args.model, log_path=args.log,
                      faults=args.faults, extra_args=shlex.split(args.serve_args))
    tally = run_chaos(cfg)
    print(format_tally(tally), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(tally.as_dict(), f, indent=2)
    return 0 if tally.ok else 1

"""How many tokens/s the daemon streams over SSE, and the CPU it takes per token.

Starts `ascendra serve` (sim executor, zero step latency, one instance, room for every
stream at once), sends N concurrent streaming completions of M tokens
(bench/micro/stream_client.py), R times, and prints min/median/max tokens/s with the CPU
seconds the daemon's controller process, its instance and this client used (and the
client's share: it runs on the same box), and when the tokens reached the client
(first token, mean token arrival, longest gap between reads). With `--compare DIR`
(repeatable) a daemon from another checkout (e.g. a `git worktree` of the commit
before) runs too, the runs interleaved so all see the same background load, and the
table ends with our/their ratios. The streams' text must be the same for all (the sim
executor's tokens depend only on the prompt). Prints figures; it does not pass or fail
(but says when a stream was short or texts differ).

    python -m bench.micro.stream_throughput [--requests 256] [--tokens 512] [--repeats 5]
                                      [--compare /tmp/sse-before]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bench.launch.daemon_launcher import PROJECT_ROOT, DaemonStartError, ServeProcess, free_port
from bench.micro.stream_client import StreamRun, run_streams
from bench.launch.processes import cpu_seconds

START_TIMEOUT = 60.0
#: Cores this process may run on: the box the daemon, its instance and the client share.
CPUS = len(os.sched_getaffinity(0))


@dataclass
class Measured:
    """One run against one daemon, and the CPU seconds its processes used meanwhile."""
    run: StreamRun
    daemon_cpu: float
    instance_cpu: float


@dataclass
class Daemon:
    """`ascendra serve` run from checkout `root` (its code on PYTHONPATH, same python), by
    bench/launch/daemon_launcher.py: this checkout's learns its port from its port file, another
    one (which may predate --port-file) gets a free port picked here."""
    name: str
    root: Path
    args: list[str]
    serve: ServeProcess | None = None
    runs: list[Measured] = field(default_factory=list)

    def start(self) -> None:
        ours = self.root == PROJECT_ROOT
        self.serve = ServeProcess(self.args, root=self.root, port_file=ours,
                                  port=0 if ours else free_port()).start()

    @property
    def url(self) -> str:
        return self.serve.url

    async def wait_serving(self) -> None:
        try:
            await self.serve.wait_serving_async(START_TIMEOUT)
        except DaemonStartError as exc:
            raise RuntimeError(f"{self.name}: {exc}") from None

    def cpu(self) -> tuple[float, float]:
        """(the daemon's own CPU seconds, its instances')."""
        return (cpu_seconds(self.serve.pid),
                sum(cpu_seconds(pid) for pid in self.serve.instance_pids()))

    async def measure(self, requests: int, tokens: int) -> StreamRun:
        daemon_cpu, instance_cpu = self.cpu()
        run = await run_streams(self.url, requests, tokens)
        after = self.cpu()
        self.runs.append(Measured(run, after[0] - daemon_cpu, after[1] - instance_cpu))
        return run

    def stop(self) -> None:
        if self.serve is not None:
            self.serve.stop(grace=30)


def daemon_args(requests: int, tokens: int) -> list[str]:
    """One sarathi instance, zero step latency, every stream admitted and in the batch at
    once with KV room for all of them (so nothing is preempted)."""
    blocks = requests * (tokens // 16 + 4) + 64
    return ["--executor", "sim", "--sim-latency", "zero", "--layout", "1xsarathi",
            "--max-num-seqs", str(requests), "--chunk-size", str(max(512, requests)),
            "--num-kv-blocks", str(blocks), "--max-tokens-limit", str(max(tokens, 16)),
            "--no-drop-expired"]


async def bench(daemons: list[Daemon], requests: int, tokens: int, repeats: int) -> None:
    for daemon in daemons:
        daemon.start()
    try:
        for daemon in daemons:
            await daemon.wait_serving()
        for daemon in daemons:  # warm up: imports, caches, the first connections
            await run_streams(daemon.url, min(requests, 32), min(tokens, 64), keep=0)
        for repeat in range(repeats):  # interleaved, the order turning each time
            turn = repeat % len(daemons)
            for daemon in daemons[turn:] + daemons[:turn]:
                run = await daemon.measure(requests, tokens)
                print(f"  {daemon.name} run {repeat + 1}: "
                      f"{run.token_events / run.seconds:,.0f} tokens/s", flush=True)
    finally:
        for daemon in daemons:
            daemon.stop()


def _spread(values: list[float], fmt: str = "{:,.0f}") -> str:
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def _row(label: str, text: str) -> None:
    print(f"  {label:<24}{text}")


def report(daemons: list[Daemon], requests: int, tokens: int) -> None:
    print(f"\n{requests} streams x {tokens} tokens, {len(daemons[0].runs)} runs each; "
          "min / median / max over the runs")
    for daemon in daemons:
        runs = [m.run for m in daemon.runs]
        print(f"{daemon.name} ({daemon.root}):")
        _row("tokens/s", _spread([r.token_events / r.seconds for r in runs]))
        _row("seconds", _spread([r.seconds for r in runs], "{:.2f}"))
        _row("tokens per read", _spread([r.token_events / r.reads for r in runs], "{:.1f}"))
        for label, values in (("first token", lambda r: r.first_token_seconds),
                              ("mean token arrival", lambda r: r.mean_token_seconds),
                              ("longest gap", lambda r: r.longest_gap_seconds)):
            medians = [1e3 * statistics.median(values(r)) for r in runs]
            worst = [1e3 * max(values(r)) for r in runs]
            _row(label + ", ms", f"{_spread(medians)} (median stream), {_spread(worst)} (worst)")
        for label, cpu in (("CPU daemon (controller)", [m.daemon_cpu for m in daemon.runs]),
                           ("CPU instance", [m.instance_cpu for m in daemon.runs]),
                           ("CPU client", [r.client_cpu_seconds for r in runs])):
            per_token = [1e6 * c / r.token_events for c, r in zip(cpu, runs)]
            _row(label, f"{_spread(cpu, '{:.2f}')} s, {_spread(per_token, '{:.1f}')} us/token")
        box = [100 * r.client_cpu_seconds / (r.seconds * CPUS) for r in runs]
        used = [100 * m.run.client_cpu_seconds
                / (m.daemon_cpu + m.instance_cpu + m.run.client_cpu_seconds) for m in daemon.runs]
        _row("client's CPU share", f"{_spread(box, '{:.0f}')} % of the box's {CPUS} cores, "
                                   f"{_spread(used, '{:.0f}')} % of the CPU all three used")
        digest = hashlib.sha256("\x00".join(runs[-1].texts).encode()).hexdigest()[:16]
        _row("text of first streams", f"sha256 {digest}")
        for run in runs:
            for problem in run.problems[:5]:
                _row("PROBLEM", problem)
    ours = [m.run.token_events / m.run.seconds for m in daemons[0].runs]
    for other in daemons[1:]:
        theirs = [m.run.token_events / m.run.seconds for m in other.runs]
        ratios = [a / b for a, b in zip(ours, theirs)]
        same = daemons[0].runs[-1].run.texts == other.runs[-1].run.texts
        print(f"tokens/s {daemons[0].name}/{other.name}: {_spread(ratios, '{:.2f}')} per pair "
              f"of runs, {statistics.median(ours) / statistics.median(theirs):.2f} of the "
              f"medians; texts {'identical' if same else 'DIFFERENT'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256, help="concurrent streams")
    parser.add_argument("--tokens", type=int, default=512, help="tokens per stream")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compare", metavar="DIR", action="append", default=[],
                        help="another checkout to run side by side (repeat for more)")
    args = parser.parse_args(argv)
    extra = daemon_args(args.requests, args.tokens)
    daemons = [Daemon("this", PROJECT_ROOT, extra)]
    daemons += [Daemon(f"compare{i + 1}" if len(args.compare) > 1 else "compare",
                       Path(root).resolve(), extra) for i, root in enumerate(args.compare)]
    try:
        import uvloop
        uvloop.run(bench(daemons, args.requests, args.tokens, args.repeats))
    except RuntimeError as exc:
        print(f"stream_throughput: {exc}", file=sys.stderr)
        return 1
    report(daemons, args.requests, args.tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())

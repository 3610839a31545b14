"""`ascendra chaos`: the daemon under load and faults; every request must get its answer.

One run: start `ascendra serve` as a subprocess on the sim executor (no model runs; the
tokenizer is the model's), drive open-loop streaming load, and inject, at fixed shares
of the run:

    25 %  kill -9 an LP instance (the first instance when the layout has no LP)
    40 %  garbage frames on the controller's ZeroMQ socket (the ipc runtime directory)
    55 %  kill -9 the HP instance (else the last instance)
    70 %  a burst far past the waiting-queue bound (-> 503 queue_full with Retry-After)
    85 %  kill -9 rank 1 of a ready instance -- only when instances run tensor-parallel
          (`--serve-args '--executor torch --tp 2 ...'`): its instance ends, as if killed
    100 % SIGTERM to the daemon; a few requests more arrive while it drains (-> 503)

while some clients disconnect mid-stream (`cancel_fraction`). Then it waits for every
answer and for the daemon's exit, and tallies what each request got:

    completed  a finish reason, after exactly the tokens it asked for (the sim executor
               never stops early, so a resumed stream must not gain or lose a token)
    dropped    a 503 with a reason code before its first token (queue_full,
               shutting_down, ttft_slo_missed, ...), by reason
    errored    any other error answer (an HTTP status, or an SSE error event that ends a
               stream: e.g. one cut at the drain timeout), by message
    cancelled  the client left on purpose
    refused    never reached the daemon (its port had closed after the drain)
    lost       accepted, but no terminal answer: a stream cut without a finish or an error
               event, a wrong token count, or nothing by the end of the run -- must be 0

`accepted` = sent - refused. The run fails (exit 1) when anything was lost, the daemon
did not exit 0, or an instance process outlived it. bench/ imports nothing of daemon/:
the daemon is a subprocess and everything is read over HTTP, /proc and ZeroMQ.
"""
from __future__ import annotations

import asyncio
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp

from bench.chaos.chaos_client import Answer, one_request
from bench.launch.daemon_launcher import ServeProcess
from bench.chaos.garbage_frames import send_garbage
from bench.loadgen.bench_cli import raise_open_files_limit
from bench.loadgen.workload import prompt_token_ids
from bench.launch.processes import alive, instance_pids, is_instance, kill_quietly, rss_mb

#: When each fault strikes, as a share of the run's duration.
FAULT_AT = {"kill_lp": 0.25, "garbage": 0.40, "kill_hp": 0.55, "burst": 0.70, "kill_rank": 0.85}


@dataclass
class ChaosConfig:
    duration: float = 20.0            # seconds of load before the SIGTERM
    qps: float = 15.0
    layout: str = "2L1H"
    sim_latency: str = "constant:0.02"
    seed: int = 0
    prompt_len: tuple[int, int] = (16, 256)
    output_len: tuple[int, int] = (8, 96)
    cancel_fraction: float = 0.1      # clients that leave mid-stream
    burst: int = 150                  # requests sent at once at 70 %
    max_queued_requests: int = 48
    drain_timeout: float = 5.0
    model: str = ""                   # "" = the built-in tiny model (its tokenizer)
    log_path: str = ""                # the daemon's log; "" = a temporary file
    extra_args: list[str] = field(default_factory=list)  # more `ascendra serve` flags
    faults: bool = True               # False: load and the final SIGTERM only (an overload run)
    start_timeout: float = 90.0


@dataclass
class Tally:
    sent: int = 0
    accepted: int = 0
    completed: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    errored: dict[str, int] = field(default_factory=dict)
    cancelled: int = 0
    refused: int = 0
    lost: int = 0
    lost_examples: list[str] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    recovered: dict[str, float] = field(default_factory=dict)
    server_dropped: dict[str, float] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    bad_frames_sent: int = 0
    daemon_exit_code: int | None = None
    orphans: int = 0
    peak_rss_mb: float = 0.0
    #: Peak RSS (daemon + instances, MB) in each quarter of the load: flat once the
    #: waiting queue is full, if memory is bounded.
    rss_mb_by_quarter: list[float] = field(default_factory=lambda: [0.0] * 4)
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.daemon_exit_code == 0 and self.orphans == 0

    def as_dict(self) -> dict:
        return {**{k: v for k, v in self.__dict__.items()}, "ok": self.ok,
                "dropped_total": sum(self.dropped.values()),
                "errored_total": sum(self.errored.values())}


# ---- the daemon ---------------------------------------------------------------------------

def serve_args(cfg: ChaosConfig) -> list[str]:
    """`ascendra serve`'s flags for a chaos run (bench/launch/daemon_launcher.py adds host, port,
    port file and runtime directory)."""
    args = ["--executor", "sim", "--sim-latency", cfg.sim_latency, "--layout", cfg.layout,
            "--heartbeat-interval", "0.2", "--restart-backoff-max", "1",
            "--drain-timeout", str(cfg.drain_timeout),
            "--max-queued-requests", str(cfg.max_queued_requests), "--recovery-timeout", "10"]
    if cfg.model:
        args += ["--model", cfg.model]
    return args + list(cfg.extra_args)


# ---- the run ------------------------------------------------------------------------------

class Chaos:
    def __init__(self, cfg: ChaosConfig, out=sys.stdout) -> None:
        self.cfg = cfg
        self.out = out
        self.rng = random.Random(cfg.seed)
        self.daemon = ServeProcess(serve_args(cfg), log_path=cfg.log_path or None)
        self.tally = Tally()
        self.answers: list[Answer] = []
        self.tasks: list[asyncio.Task] = []
        self.seen_pids: set[int] = set()
        self.start = 0.0

    def say(self, text: str) -> None:
        line = f"[{time.monotonic() - self.start:6.2f} s] {text}" if self.start else text
        self.tally.faults.append(line)
        print(line, file=self.out, flush=True)

    async def run(self) -> Tally:
        self.daemon.start()
        try:
            await self.daemon.wait_serving_async(self.cfg.start_timeout)
            connector = aiohttp.TCPConnector(limit=0, force_close=True)
            async with aiohttp.ClientSession(connector=connector,
                                             timeout=aiohttp.ClientTimeout(total=None)) as session:
                await self._load(session)
        finally:  # a last resort when it still runs: SIGKILL to it and its instances
            self.daemon.stop(grace=0)
        return self.tally

    async def _load(self, session: aiohttp.ClientSession) -> None:
        cfg = self.cfg
        health = await self._get_json(session, "/health")
        instances = health["instances"]
        roles = {i["id"]: i["role"] for i in instances}
        self.seen_pids.update(i["pid"] for i in instances if i["pid"])
        self.seen_pids.update(p for i in instances for p in i.get("rank_pids", []))
        lp = next((i for i in sorted(roles) if roles[i] == "lp"), min(roles))
        hp = next((i for i in sorted(roles) if roles[i] == "hp"), max(roles))
        self.start = time.monotonic()
        self.say(f"chaos: layout {cfg.layout}, sim executor ({cfg.sim_latency}), {cfg.qps:g} "
                 f"requests/s for {cfg.duration:g} s, seed {cfg.seed}, daemon pid "
                 f"{self.daemon.proc.pid}")
        faults = sorted([(FAULT_AT["kill_lp"], "kill_lp", lp), (FAULT_AT["kill_hp"], "kill_hp", hp),
                         (FAULT_AT["garbage"], "garbage", None), (FAULT_AT["burst"], "burst", None)]
                        ) if cfg.faults else []
        if cfg.faults and any(i.get("rank_pids") for i in instances):  # tensor parallel
            faults.append((FAULT_AT["kill_rank"], "kill_rank", None))
        sampler = asyncio.create_task(self._sample(session))
        t, fault_i = 0.0, 0
        while True:
            t += self.rng.expovariate(cfg.qps)
            while fault_i < len(faults) and faults[fault_i][0] * cfg.duration <= t:
                await self._sleep_until(faults[fault_i][0] * cfg.duration)
                await self._fault(session, faults[fault_i][1], faults[fault_i][2], roles)
                fault_i += 1
            if t >= cfg.duration:
                break
            await self._sleep_until(t)
            self._send(session)
        await self._sleep_until(cfg.duration)
        await self._read_server_counts(session)
        self.say(f"SIGTERM to the daemon (pid {self.daemon.proc.pid})")
        self.daemon.proc.send_signal(signal.SIGTERM)
        for _ in range(5):  # arrivals while it drains: 503 shutting_down, or refused once closed
            await asyncio.sleep(0.05)
            self._send(session)
        await self._finish(sampler)

    async def _sleep_until(self, t: float) -> None:
        delay = self.start + t - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    def _send(self, session: aiohttp.ClientSession) -> None:
        cfg = self.cfg
        index = len(self.answers)
        max_tokens = self.rng.randint(*cfg.output_len)
        cancel = (self.rng.randint(1, max(1, max_tokens - 1))
                  if self.rng.random() < cfg.cancel_fraction else None)
        answer = Answer(index, max_tokens, cancel, sent_at=time.monotonic() - self.start)
        prompt = prompt_token_ids(cfg.seed, index, self.rng.randint(*cfg.prompt_len))
        self.answers.append(answer)
        self.tasks.append(asyncio.create_task(
            one_request(session, self.daemon.url, answer, prompt)))

    async def _fault(self, session, kind: str, instance: int | None, roles: dict) -> None:
        if kind in ("kill_lp", "kill_hp"):
            health = await self._get_json(session, "/health")
            slot = next(i for i in health["instances"] if i["id"] == instance)
            if slot["pid"] and slot["state"] == "ready":
                kill_quietly(slot["pid"])
                self.say(f"kill -9 instance {instance} ({roles[instance]}, pid {slot['pid']}) "
                         f"holding {slot['in_flight']} requests")
            else:
                self.say(f"instance {instance} is {slot['state']}; not killed")
        elif kind == "kill_rank":
            health = await self._get_json(session, "/health")
            slot = next((i for i in health["instances"]
                         if i.get("rank_pids") and i["state"] == "ready"), None)
            if slot is not None:
                kill_quietly(slot["rank_pids"][0])
                self.say(f"kill -9 rank 1 of instance {slot['id']} ({roles[slot['id']]}, pid "
                         f"{slot['rank_pids'][0]}) holding {slot['in_flight']} requests")
            else:
                self.say("no instance is ready; no rank killed")
        elif kind == "garbage":
            n = await asyncio.to_thread(send_garbage, self.daemon.runtime_dir)
            self.tally.bad_frames_sent += n
            self.say(f"{n} garbage messages on {self.daemon.runtime_dir}/controller.sock")
        elif kind == "burst":
            for _ in range(self.cfg.burst):
                self._send(session)
            self.say(f"burst of {self.cfg.burst} requests at once "
                     f"(max_queued_requests {self.cfg.max_queued_requests})")

    async def _sample(self, session: aiohttp.ClientSession) -> None:
        """Peak RSS of the daemon and its instances, and every instance pid seen."""
        pid = self.daemon.proc.pid
        while self.daemon.proc.poll() is None:
            pids = instance_pids(pid)
            self.seen_pids.update(pids)
            total = round(rss_mb(pid) + sum(rss_mb(p) for p in pids), 1)
            self.tally.peak_rss_mb = max(self.tally.peak_rss_mb, total)
            quarter = int(4 * (time.monotonic() - self.start) / self.cfg.duration)
            if self.start and 0 <= quarter < 4:
                by_quarter = self.tally.rss_mb_by_quarter
                by_quarter[quarter] = max(by_quarter[quarter], total)
            await asyncio.sleep(0.25)

    async def _read_server_counts(self, session: aiohttp.ClientSession) -> None:
        try:
            async with session.get(self.daemon.url + "/metrics") as r:
                text = await r.text()
        except aiohttp.ClientError:
            return
        for name, label, value in re.findall(
                r'^ascendra_(recovered|dropped|instance_restarts)_total\{\w+="([^"]*)"\} (\S+)$',
                text, re.M):
            target = {"recovered": self.tally.recovered, "dropped": self.tally.server_dropped,
                      "instance_restarts": self.tally.restarts}[name]
            target[label] = int(float(value))

    async def _finish(self, sampler: asyncio.Task) -> None:
        cfg = self.cfg
        _, pending = await asyncio.wait(self.tasks, timeout=cfg.drain_timeout + 15) \
            if self.tasks else (set(), set())
        for task in pending:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        try:
            code = await asyncio.to_thread(self.daemon.proc.wait, cfg.drain_timeout + 20)
        except subprocess.TimeoutExpired:
            code = None
            self.say("the daemon did not exit in time; killing it")
            self.daemon.stop(grace=0)
        sampler.cancel()
        self.tally.daemon_exit_code = code
        self.tally.duration_s = round(time.monotonic() - self.start, 2)
        self.say(f"daemon exited with code {code}")
        deadline = time.monotonic() + 5
        while any(alive(p) for p in self.seen_pids) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        orphans = [p for p in self.seen_pids if alive(p) and is_instance(p)]
        for p in orphans:
            kill_quietly(p)
        self.tally.orphans = len(orphans)
        self._count()

    def _count(self) -> None:
        tally = self.tally
        dropped, errored = Counter(), Counter()
        for a in self.answers:
            if a.outcome == "completed":
                tally.completed += 1
            elif a.outcome == "dropped":
                dropped[a.reason] += 1
            elif a.outcome == "errored":
                errored[a.reason] += 1
            elif a.outcome == "cancelled":
                tally.cancelled += 1
            elif a.outcome == "refused":
                tally.refused += 1
            else:
                tally.lost += 1
                if len(tally.lost_examples) < 10:
                    tally.lost_examples.append(f"request {a.index} (sent at {a.sent_at:.2f} s, "
                                               f"{a.tokens} tokens): {a.reason or 'no answer'}")
        tally.sent = len(self.answers)
        tally.accepted = tally.sent - tally.refused
        tally.dropped, tally.errored = dict(dropped.most_common()), dict(errored.most_common())

    async def _get_json(self, session: aiohttp.ClientSession, path: str) -> dict:
        async with session.get(self.daemon.url + path) as r:
            return await r.json(content_type=None)


def format_tally(tally: Tally) -> str:
    def by(counts: dict) -> str:
        return ", ".join(f"{k} {v}" for k, v in counts.items()) or "-"

    lines = [
        "", "chaos tally",
        f"  sent              {tally.sent}",
        f"  accepted          {tally.accepted}",
        f"  completed         {tally.completed}",
        f"  dropped           {sum(tally.dropped.values()):<5} {by(tally.dropped)}",
        f"  errored           {sum(tally.errored.values()):<5} {by(tally.errored)}",
        f"  client-cancelled  {tally.cancelled}",
        f"  lost              {tally.lost}",
        f"  refused (closed)  {tally.refused}",
        f"  server: recovered {by(tally.recovered)}; dropped {by(tally.server_dropped)}; "
        f"instance restarts {by(tally.restarts)}",
        f"  daemon exit code  {tally.daemon_exit_code}; orphan instances {tally.orphans}; "
        f"peak RSS {tally.peak_rss_mb:.0f} MB (by quarter of the run: "
        f"{' / '.join(f'{m:.0f}' for m in tally.rss_mb_by_quarter)}); {tally.duration_s:.1f} s",
    ]
    lines += [f"  lost: {example}" for example in tally.lost_examples]
    lines.append("  result            " + ("OK" if tally.ok else "FAILED"))
    return "\n".join(lines)


def run_chaos(cfg: ChaosConfig, out=sys.stdout) -> Tally:
    raise_open_files_limit()
    return asyncio.run(Chaos(cfg, out).run())

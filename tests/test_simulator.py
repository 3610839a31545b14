"""The simulator (bench/simulator.py) is deterministic and runs the daemon's own code.

* Same config, workload and seed -> the same record for every request, also in another
  process with another hash seed; another seed -> another workload.
* One instance in the simulator schedules exactly the batches that a real `Engine`
  over the daemon's sim executor (built as an instance process builds it), stepped by
  hand on a virtual clock, schedules for the same arrivals.
* The real daemon (1L1H, sim executor with a constant step latency) and the simulator
  fed the same arrivals (a trace file with arrival times) at the same latency route,
  offload and serve the same requests.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import msgspec
import pytest

from bench.records import RunResult
from bench.results import encode_result
from bench.simulator import Simulation
from bench.workload import build_workload
from engines.engine import Engine
from engines.executors.config import SIM_DEFAULT_KV_BLOCKS, ExecutorConfig, build_executor
from engines.perf_setup import build_perf_model
from engines.scheduler_config import SchedulerConfig
from ipc.params import SamplingParams
from tests.daemon_fixture import PROJECT_ROOT, wait_for
from tests.simulator_helpers import length_trace, run, sim_config, without_wall_time, write_jsonl


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> str:
    return length_trace(tmp_path_factory.mktemp("trace"))


# ---- determinism ---------------------------------------------------------------------------
#: Loaded enough that 2L1H offloads and hands out tickets, small enough to take ~2 s.
RUNS = {"2L1H": dict(qps=20.0, num_requests=120), "3xsarathi": dict(qps=20.0, num_requests=120)}

_CHILD = """
import sys
from bench.results import encode_result
from tests.simulator_helpers import run, without_wall_time
layout, trace, qps, n = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
result = run(layout, trace, qps=qps, num_requests=n, seed=0)
sys.stdout.buffer.write(encode_result(without_wall_time(result)))
"""


@pytest.mark.parametrize("layout", sorted(RUNS))
def test_same_inputs_give_the_same_records_in_any_process(layout, trace):
    """Run once here and once in a fresh interpreter with another PYTHONHASHSEED: every
    request's record (arrival, token times, instance, offload, outcome) and the summary
    are identical."""
    settings = RUNS[layout]
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, layout, trace, str(settings["qps"]),
         str(settings["num_requests"])],
        cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    here = without_wall_time(run(layout, trace, seed=0, **settings))
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err.decode()[-3000:]
    there = msgspec.json.decode(out, type=RunResult)

    assert len(here.records) == settings["num_requests"]
    assert here.completed > 0
    assert all(r.token_times for r in here.records if r.outcome == "completed")
    if layout == "2L1H":  # the run went through offloads and tickets, not only round-robin
        assert here.offloaded > 0
        hp = [r for r in here.records if r.instance == 2]
        assert any(not r.offloaded for r in hp) and any(r.offloaded for r in hp)
    assert there.records == here.records
    assert there == here
    assert encode_result(there) == encode_result(here)


def test_another_seed_gives_another_workload_and_run(trace):
    settings = RUNS["3xsarathi"]
    workload = lambda seed: build_workload(trace, rate=settings["qps"],  # noqa: E731
                                           num_requests=settings["num_requests"], seed=seed,
                                           max_model_len=8192)
    zero, one = workload(0), workload(1)
    assert zero == workload(0)
    assert [w.arrival for w in zero] != [w.arrival for w in one]
    lengths = lambda work: [(w.prompt_len, w.output_len) for w in work]  # noqa: E731
    assert lengths(zero) != lengths(one)
    a = run("3xsarathi", trace, seed=0, **settings)
    b = run("3xsarathi", trace, seed=1, **settings)
    assert [r.arrival for r in a.records] != [r.arrival for r in b.records]
    assert a.config["seed"] == 0 and b.config["seed"] == 1


# ---- the simulator's instance is the real engine -------------------------------------------
class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _recording(latency_fn, batches: list):
    """Wraps an executor's latency function to note every batch it is asked to run."""
    def latency(batch):
        batches.append(tuple((c.request.request_id, c.start, c.num_tokens) for c in batch.chunks))
        return latency_fn(batch)
    return latency


def _hand_stepped(workload, config, mode: str):
    """The instance process's loop (engines/instance.py) over a real Engine built as
    `engines.instance_main.serve` builds it, with the sim executor's sleep advancing a
    virtual clock: take in every submit that has arrived, step, repeat. Submits take
    `config.ipc_delay` to arrive and tokens as long to come back, as in the simulator."""
    clock = VirtualClock()
    executor_config = ExecutorConfig(kind="sim", latency=f"profile:{config.profile}",
                                     block_size=config.block_size,
                                     max_model_len=config.max_model_len)
    executor = build_executor(executor_config)
    executor.sleep = clock.advance
    scheduler = SchedulerConfig(mode=mode).validate()
    engine = Engine(executor, scheduler, clock=clock,
                    perf_model=build_perf_model(executor, executor_config, scheduler))
    batches: list = []
    executor.latency_fn = _recording(executor.latency_fn, batches)
    pending, ipc = deque(workload), config.ipc_delay
    first_token, finished, offloaded = {}, {}, []
    while pending or engine.has_work:
        if not engine.has_work:
            clock.now = max(clock.now, pending[0].arrival + ipc)
        while pending and pending[0].arrival + ipc <= clock.now:
            work = pending.popleft()
            engine.add_request([3] * work.prompt_len,
                               SamplingParams(max_tokens=work.output_len, ignore_eos=True),
                               request_id=f"r{work.index}", arrival_time=work.arrival,
                               deadline=work.arrival + config.ttft_slo, tbt_slo=config.tbt_slo)
        result = engine.step()
        for output in result.outputs:
            first_token.setdefault(output.request_id, clock.now + ipc)
            if output.finish_reason is not None:
                finished[output.request_id] = clock.now + ipc
        offloaded += [r.request_id for r in result.offloaded]
    return batches, first_token, finished, offloaded


@pytest.mark.parametrize("mode, qps", [("sarathi", 3.0), ("lp", 6.0)])
def test_one_instance_schedules_what_a_hand_stepped_engine_schedules(mode, qps, trace):
    """Step for step the same batches (request, first token position, tokens), the same
    first-token and finish times, and (LP) the same requests offloaded."""
    config = sim_config(f"1x{mode}")
    workload = build_workload(trace, rate=qps, num_requests=60, seed=0,
                              max_model_len=config.max_model_len)
    simulation = Simulation(config, workload)
    sim_batches: list = []
    executor = simulation.instances[0].executor
    executor.latency_fn = _recording(executor.latency_fn, sim_batches)
    records = {f"r{r.index}": r for r in simulation.run()}

    batches, first_token, finished, offloaded = _hand_stepped(workload, config, mode)

    assert len(sim_batches) > 100
    assert any(len(b) > 1 for b in sim_batches), "continuous batching happened"
    assert sim_batches == batches
    served = {rid: r for rid, r in records.items() if r.outcome == "completed"}
    assert {rid: r.first_token_time for rid, r in served.items()} == pytest.approx(
        {rid: first_token[rid] for rid in served}, abs=1e-9)
    assert {rid: r.end_time for rid, r in served.items()} == pytest.approx(finished, abs=1e-9)
    # With no HP in the layout, the simulator answers an LP's offload with an error.
    assert sorted(rid for rid, r in records.items() if r.offloaded) == sorted(offloaded)
    if mode == "lp":
        assert offloaded, "the LP instance offloaded (so its offload decisions were compared)"


# ---- the daemon and the simulator decide alike -----------------------------------------------
#: Every engine step takes STEP seconds in both (sim executor, `constant:STEP`).
STEP = 0.15
TTFT_SLO = 4.5 * STEP
LONG, SHORT = 1000, 300     # prompt tokens: LONG is 2 chunks of 512, SHORT one
OUTPUT = 3
#: (phase start in the simulation, [(arrival offset in the phase, prompt tokens), ...]).
PHASES = [(0.0, [(0.002 * i, LONG) for i in range(5)]),
          (3.0, [(0.0, LONG)]),
          (5.0, [(0.0, SHORT), (0.003, SHORT)])]
#: Per phase: (served by the LP, served by the HP, offloaded LP -> HP).
EXPECTED = [(2, 3, 2), (0, 1, 0), (1, 1, 0)]
DAEMON_FLAGS = ("--layout", "1L1H", "--executor", "sim", "--sim-latency", f"constant:{STEP}",
                "--ttft-slo", str(TTFT_SLO), "--tbt-slo", "1.0", "--chunk-size", "512",
                "--heartbeat-interval", "0.1")


def _simulated_phases(tmp_path) -> list[tuple[int, int, int]]:
    rows = [{"prompt_tokens": n, "output_tokens": OUTPUT, "arrival_time": start + offset}
            for start, phase in PHASES for offset, n in phase]
    trace = write_jsonl(tmp_path / "arrivals.jsonl", rows)
    config = sim_config("1L1H", latency=f"constant:{STEP}", ttft_slo=TTFT_SLO, tbt_slo=1.0,
                        num_kv_blocks=SIM_DEFAULT_KV_BLOCKS, max_model_len=4096,
                        scheduler=SchedulerConfig(chunk_size=512))
    from bench.simulate import simulate
    result = simulate(config, trace=trace, qps=1.0, num_requests=len(rows), keep_records=True)
    records = sorted(result.records, key=lambda r: r.arrival)
    assert all(r.outcome == "completed" for r in records)
    counts, i = [], 0
    for k, (start, phase) in enumerate(PHASES):
        mine = records[i:i + len(phase)]
        i += len(phase)
        if k + 1 < len(PHASES):  # each phase is over before the next begins
            assert max(r.end_time for r in mine) < PHASES[k + 1][0] - 0.5
        counts.append((sum(r.instance == 0 for r in mine), sum(r.instance == 1 for r in mine),
                       sum(r.offloaded for r in mine)))
    return counts


def _metric(daemon, name: str) -> float:
    _, _, body = daemon.request("GET", "/metrics")
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
               if line.startswith(name))


def _counters(daemon) -> tuple[float, float, float]:
    return (_metric(daemon, 'ascendra_instance_served_total{instance="0"'),
            _metric(daemon, 'ascendra_instance_served_total{instance="1"'),
            _metric(daemon, "ascendra_offloads_total"))


def _send_phase(daemon, phase) -> list[float]:
    """Each request at its offset (open loop, one thread each); returns when it was sent."""
    start = time.monotonic()

    def one(item):
        offset, prompt_len = item
        time.sleep(max(0.0, start + offset - time.monotonic()))
        sent = time.monotonic() - start
        status, _, raw = daemon.request("POST", "/v1/completions", {
            "prompt": [3] * prompt_len, "max_tokens": OUTPUT, "ignore_eos": True})
        assert status == 200, raw
        return sent

    with ThreadPoolExecutor(max_workers=len(phase)) as pool:
        return list(pool.map(one, phase))


def test_daemon_and_simulator_route_offload_and_serve_alike(daemon_factory, tmp_path):
    """1L1H, every step STEP = 0.15 s, TTFT SLO 4.5 steps, prompts of 2 chunks (LONG):

    A. 5 requests within 8 ms. The idle HP holds a ticket: the first takes it; the HP asks
       again only after its next step (>= 150 ms later), so the other 4 go to the LP. The
       LP's performance model predicts 2 steps per prefill: it keeps the first two
       (start <= 4 steps < 4.5) and offloads the last two (start >= 4 steps > 4.5 - 2 own
       -> slack 2.5 steps < worst-case HP 3 steps), at its first or second step.
    B. One request, HP idle again: the ticket takes it.
    C. Two short requests 3 ms apart: the first takes the ticket, the second the LP.

    Every decision point is at least a third of a step (50 ms) from flipping, so the
    daemon's scheduling and messaging delays (a few ms) cannot change them. The API does
    not say which instance served a request, so the daemon side is read per phase from
    its counters (served per instance, offloads), after waiting for the HP's ticket and
    the end of the previous phase; the simulator's records give the same per phase.
    """
    simulated = _simulated_phases(tmp_path)
    assert simulated == EXPECTED

    daemon = daemon_factory(*DAEMON_FLAGS)
    hp_ticket = lambda: daemon.health()["instances"][1]["ticket_open"]  # noqa: E731
    observed = []
    for start, phase in PHASES:
        wait_for(hp_ticket, 15, what="the HP instance's ticket")
        before = _counters(daemon)
        sent = _send_phase(daemon, phase)
        assert max(sent) - max(o for o, _ in phase) < STEP / 3, (
            f"the client sent the phase late ({sent}): too slow a machine for this test")
        after = wait_for(lambda: (c := _counters(daemon))[0] + c[1] >= before[0] + before[1]
                         + len(phase) and c, 15, what="the phase's requests counted as served")
        observed.append(tuple(int(a - b) for a, b in zip(after, before)))
    assert observed == simulated

"""`serving_info` (ipc/serving_info.py): where the daemon served a response's choices.

The controller core's `Settle` carries it (instances, offloaded, queue delay); a
simulated run's records (bench/sim/record_keeper.py) observe the same core, so a live
client reading `serving_info` records what a simulated run does (and a refusal reads
alike in both). Then the HTTP API writes it when asked, in every shape of answer: a
body, a stream's last chunk, an error.

Covers: ipc/serving_info.py, bench/sim/record_keeper.py.
"""
from __future__ import annotations

import asyncio
import json

import openai
import pytest

from bench.loadgen.loadgen import _http_error
from bench.loadgen.workloads import build_requests, workload
from bench.records.schema import RequestRecord
from bench.sim.record_keeper import RecordKeeper
from bench.sim.simulator import Simulation
from daemon.core.events import Refuse, Settle
from daemon.core.request_state import Outcome
from daemon.errors import ApiError
from daemon.request_handle import RequestHandle
from daemon.responses import error_body
from ipc.api_codes import REFUSAL_CODES, EndCode, Refusal
from ipc.messages import TokenOutput
from tests.api_fakes import CHAT, FakeController, assert_openai_error, call
from tests.daemon_fixture import sim_args
from tests.simulator_helpers import sim_config


IPC_DELAY = sim_config("1xsarathi").ipc_delay


def settled_run(layout: str, qps: float, n: int = 120) -> tuple[dict, dict[str, Settle]]:
    """A simulated run's records, and the `Settle` of each request that got one."""
    settles: dict[str, Settle] = {}
    work = build_requests(workload("poisson"), rate=qps, num_requests=n, seed=0,
                          max_model_len=8192)
    sim = Simulation(sim_config(layout), work)
    observe = sim.keeper.observe

    def watching(action, now):
        if isinstance(action, Settle):
            settles[action.request_id] = action
        observe(action, now)

    sim.keeper.observe = watching
    sim.run()
    return sim.records, settles


@pytest.mark.slow
@pytest.mark.parametrize("layout, qps", [("2L1H", 40.0), ("1P1D", 10.0), ("3xsarathi", 20.0), ("3A", 40.0)])
def test_a_settle_places_a_request_as_the_simulators_records_do(layout, qps):
    records, settles = settled_run(layout, qps)
    assert len(settles) == len(records)
    for request_id, settle in settles.items():
        record = records[request_id]
        assert list(settle.instances) == record.instances, request_id
        assert settle.offloaded == record.offloaded, request_id
        if record.sched_delay is None:
            assert settle.queue_delay is None, request_id
        else:  # the end of the step that admitted it as the controller got it (one message's
            # transit later), less the step's length
            assert settle.queue_delay == pytest.approx(record.sched_delay + IPC_DELAY,
                                                       abs=1e-9), request_id
    if layout == "2L1H":
        assert any(s.offloaded for s in settles.values())
    if layout == "1P1D":
        assert all(len(s.instances) == 2 for s in settles.values() if s.outcome.value == "completed")


@pytest.mark.parametrize("refusal, outcome", [
    (Refusal.QUEUE_FULL, "dropped"), (Refusal.STARTING, "errored"),
    (Refusal.NO_INSTANCE, "errored"), (Refusal.SHUTTING_DOWN, "errored")])
def test_a_refusal_reads_in_simulated_records_as_in_a_live_clients(refusal, outcome):
    """Shed under load (queue_full) is a drop, any other refusal a failure, under the code
    the client gets: so `ascendra records` puts both runs' misses under the same cause."""
    simulated, live = (RequestRecord(index=0, arrival=0.0, prompt_len=1, output_len=1)
                       for _ in range(2))
    RecordKeeper({"r0": simulated}).observe(Refuse("r0", refusal, "no", 1), now=1.0)
    _http_error(live, 503, json.dumps(error_body("no", 503, code=REFUSAL_CODES[refusal])).encode(),
                now=1.0)
    assert (simulated.outcome, simulated.error_code) == (live.outcome, live.error_code)
    assert simulated.outcome == outcome


# ---- the HTTP API ------------------------------------------------------------------------
#: Where PlacingController says every request went: an LP, then the HP it was offloaded to.
PLACED, QUEUE_DELAY = (0, 2), 0.25


class PlacingController(FakeController):
    """The API tests' fake controller, settling each request as the real one does (its
    handle's `settled`); `fail_at` (a token index) ends it there instead, with a drop
    before its first token or an instance failure after it."""

    fail_at: int | None = None

    async def submit(self, prompt_token_ids, sampling, *, request_id, **_):
        handle = RequestHandle(request_id, self._closed)
        loop = asyncio.get_running_loop()
        for i in range(sampling.max_tokens):
            if i == self.fail_at:
                loop.call_soon(self._fail, handle, i)
                break
            loop.call_soon(handle.put, TokenOutput(
                request_id, self.token_id, "length" if i == sampling.max_tokens - 1 else None))
        return handle

    @staticmethod
    def _closed(handle: RequestHandle, outcome: Outcome) -> None:
        if handle.settled is None:
            handle.settled = Settle(handle.request_id, outcome, instance=PLACED[-1],
                                    instances=PLACED, offloaded=True, queue_delay=QUEUE_DELAY)

    @staticmethod
    def _fail(handle: RequestHandle, at: int) -> None:
        code = EndCode.TTFT_SLO_MISSED if at == 0 else EndCode.INSTANCE_FAILED
        handle.settled = Settle(handle.request_id, Outcome.DROPPED if at == 0 else Outcome.ERRORED,
                                code, "gone", instance=0, instances=(0,))
        handle.fail(ApiError(503, "gone", code.value))


@pytest.fixture
def controller(tokenizer):
    return PlacingController(tokenizer)


ASKED = {"prompt": "Hi", "max_tokens": 3, "return_serving_info": True}
SERVED = {"index": 0, "instances": list(PLACED), "offloaded": True, "queue_delay": QUEUE_DELAY}


async def sse_events(client, body: dict) -> list[dict]:
    resp, raw = await call(client, "POST", "/v1/completions", {**body, "stream": True})
    assert resp.status == 200, raw
    data = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


async def test_a_body_says_where_each_choice_ran_only_when_asked(client):
    resp, raw = await call(client, "POST", "/v1/completions", {**ASKED, "n": 2})
    body = json.loads(raw)
    assert resp.status == 200 and body["serving_info"] == {"choices": [SERVED, {**SERVED, "index": 1}]}
    resp, raw = await call(client, "POST", "/v1/chat/completions", {
        "messages": CHAT, "max_tokens": 2, "return_serving_info": True})
    assert json.loads(raw)["serving_info"] == {"choices": [SERVED]}
    resp, raw = await call(client, "POST", "/v1/completions", {**ASKED, "return_serving_info": False})
    assert "serving_info" not in json.loads(raw)


@pytest.mark.parametrize("include_usage", [True, False])
async def test_a_stream_says_it_in_a_last_chunk_without_choices(client, include_usage):
    events = await sse_events(client, {**ASKED, "stream_options": {"include_usage": include_usage}})
    *tokens, last = events
    assert [e["choices"][0]["finish_reason"] for e in tokens] == [None, None, "length"]
    assert last["choices"] == [] and last["serving_info"] == {"choices": [SERVED]}
    assert ("usage" in last) is include_usage
    plain = await sse_events(client, {**ASKED, "return_serving_info": False})
    assert all("serving_info" not in e for e in plain) and len(plain) == 3


async def test_a_drop_before_the_first_token_says_it_beside_the_error(client, controller):
    controller.fail_at = 0
    resp, raw = await call(client, "POST", "/v1/completions", {**ASKED, "stream": True})
    body = json.loads(raw)
    assert resp.status == 503 and body["error"]["code"] == "ttft_slo_missed"
    assert body["serving_info"] == {"choices": [{"index": 0, "instances": [0]}]}
    resp, raw = await call(client, "POST", "/v1/completions", {**ASKED, "return_serving_info": False})
    assert_openai_error(json.loads(raw), 503, "gone")  # nothing beside the error unasked


async def test_a_stream_that_fails_midway_says_it_in_its_error_event(client, controller):
    controller.fail_at = 1
    *_, error = await sse_events(client, ASKED)
    assert error["error"]["code"] == "instance_failed"
    assert error["serving_info"] == {"choices": [{"index": 0, "instances": [0]}]}


async def test_the_openai_client_reads_serving_info_as_an_extra_field(client):
    """openai's models keep fields they do not declare (`model_extra`), in a body, a
    stream's chunks and its choiceless last chunk alike."""
    api = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="x", max_retries=0)
    async with api:
        extra = {"return_serving_info": True}
        done = await api.completions.create(model="tiny", prompt="Hi", max_tokens=2,
                                            extra_body=extra)
        assert done.choices[0].finish_reason == "length"
        assert done.model_extra["serving_info"] == {"choices": [SERVED]}
        chat = await api.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2,
                                                 extra_body=extra)
        assert chat.model_extra["serving_info"]["choices"][0]["instances"] == list(PLACED)
        chunks = [c async for c in await api.chat.completions.create(
            model="tiny", messages=CHAT, max_tokens=2, stream=True,
            stream_options={"include_usage": True}, extra_body=extra)]
        assert chunks[-1].usage.completion_tokens == 2 and chunks[-1].choices == []
        assert chunks[-1].model_extra["serving_info"] == {"choices": [SERVED]}
        chunks = [c async for c in await api.completions.create(
            model="tiny", prompt="Hi", max_tokens=2, stream=True, extra_body=extra)]
        assert chunks[-1].usage is None and chunks[-1].model_extra["serving_info"]


@pytest.mark.slow
def test_the_real_daemon_says_where_it_served_through_the_openai_client(daemon_factory):
    """A 1P1D daemon (sim executor): every request is prefilled on instance 0 and decoded
    on 1, which the answer says -- its body, and a stream's last chunk -- with the wait
    before its prefill."""
    daemon = daemon_factory(*sim_args("constant:0.002", layout="1P1D"))
    api = openai.OpenAI(base_url=daemon.base_url + "/v1", api_key="x", max_retries=0, timeout=30)
    extra = {"return_serving_info": True, "ignore_eos": True}
    with api:
        done = api.completions.create(model=api.models.list().data[0].id, prompt="Hi",
                                      max_tokens=4, extra_body=extra)
        [served] = done.model_extra["serving_info"]["choices"]
        assert served["instances"] == [0, 1] and served["queue_delay"] >= 0
        chunks = list(api.chat.completions.create(
            model=done.model, messages=CHAT, max_tokens=4, stream=True, extra_body=extra))
        assert chunks[-1].choices == [] and chunks[-1].usage is None
        assert chunks[-1].model_extra["serving_info"]["choices"][0]["instances"] == [0, 1]
        plain = api.completions.create(model=done.model, prompt="Hi", max_tokens=2)
        assert "serving_info" not in (plain.model_extra or {})

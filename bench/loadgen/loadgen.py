"""The open-loop streaming client behind `ascendra bench` (its flags: bench/loadgen/bench_cli.py).

Open loop: every request is sent at its arrival offset whether or not earlier ones were
answered, over as many concurrent connections as it takes (the connector has no limit;
`max_concurrency` caps it on purpose, as in `vllm bench serve`). Each request is a
streaming POST to `endpoint` with `max_tokens` = the trace's output length and
`ignore_eos`, carrying the run's `ttft_slo`/`tbt_slo` (a request's own, when its
workload gives it some, e.g. an SLO class) and priority (its tenant's, when not 0: a
`--tenant-mix`), its tenant (if any) in the header `x-gateway-inference-fairness-id`
(bench/loadgen/tenant_mix.py): to /v1/completions a token-id
prompt of the trace's length; to a chat endpoint (a path ending in /chat/completions) one
user message of as many common English words (one token each in the usual BPE
vocabularies; the record's `prompt_len` then becomes the server's count, from usage).

Token timing: `token_times` holds the arrival time (time.monotonic, seconds since the
run started) of every SSE chunk that carries a choice, so a chunk stands for one token
when the server sends one chunk per token. A server may put several tokens in one
chunk, or send none for a token with no text yet; the exact number of tokens comes from
the final usage chunk (`stream_options.include_usage`) into `num_output_tokens`. Mean
TBT -- what goodput uses -- is therefore exact ((last - first) / (tokens - 1)); the
distribution of single gaps is per chunk (a gap that spans several tokens counts once).

Outcomes: completed (a finish_reason arrived), dropped (shed under load: error code
`ttft_slo_missed` or `queue_full`, as an HTTP error or an SSE error event; as a
simulated run's records say, bench/records/schema.py `failure_outcome`), errored (any other
HTTP status, SSE error, broken connection or malformed stream), lost (no terminal answer
before the run's deadline: the last arrival + `timeout`). The run always ends by that
deadline.

Where it ran: every request asks for `serving_info` (ipc/serving_info.py), which
Ascendra puts in a stream's last chunk, or beside the error of one that failed; it fills
the record's `instances`, `instance`, `offloaded`, `role` and `sched_delay` as a
simulated run's are (other servers send none: they stay unset).
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import NamedTuple

import aiohttp
import msgspec
import numpy as np

from bench.loadgen.progress import Progress
from bench.loadgen.sse import sse_data
from ipc.tenancy import TENANT_HEADER
from bench.loadgen.workload import WorkloadRequest, request_prompt
from bench.records.schema import RequestRecord, failure_outcome
from ipc.serving_info import ServingInfo

#: Words of a chat prompt: common English words, one token each (with their space) in the
#: byte-level BPE vocabularies of Llama 3, Qwen2, GPT-2 and the tiny model.
CHAT_WORDS = ("the", "of", "and", "to", "in", "is", "that", "it", "was", "for", "on", "are",
              "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one",
              "had", "by", "but", "not", "what", "all", "were", "we", "when", "your", "can")


class LoadRun(NamedTuple):
    records: list[RequestRecord]
    #: Run start -> the later of the last send and the last terminal answer; a lost
    #: request's wait until the deadline does not stretch it (nor deflate the rates).
    duration_s: float
    #: Stopped early (Ctrl-C): the requests the run had (`records` holds those that had
    #: finished); 0: it ran to the end.
    interrupted: int = 0
    #: When interrupted: every request sent, finished or not (the offered rate is theirs).
    sent: list[RequestRecord] = []


class Client:
    """What every request of a run shares: the session, the clock, the request fields."""

    def __init__(self, session: aiohttp.ClientSession, url: str, fields: dict, seed: int,
                 progress: Progress, max_concurrency: int | None) -> None:
        self.session, self.url, self.fields, self.seed = session, url, fields, seed
        self.progress = progress
        self.start = time.monotonic()
        self.slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    def now(self) -> float:
        return time.monotonic() - self.start

    @property
    def chat(self) -> bool:
        return is_chat_endpoint(self.url)

    def body(self, request: WorkloadRequest) -> bytes:
        if self.chat:
            prompt = {"messages": [{"role": "user", "content": chat_prompt(
                self.seed, request.index, request.prompt_len)}]}
        else:
            prompt = {"prompt": request_prompt(request, self.seed)}
        own = {k: v for k, v in (("ttft_slo", request.ttft_slo), ("tbt_slo", request.tbt_slo),
                                 ("priority", request.priority or None))
               if v is not None}  # the request's own targets and priority win over the run's
        return json.dumps({**self.fields, **own, **prompt,
                           "max_tokens": request.output_len}).encode()

    def headers(self, request: WorkloadRequest) -> dict[str, str]:
        """The request's own headers (the session adds the key): its tenant, if any."""
        headers = {"Content-Type": "application/json"}
        if request.tenant is not None:
            headers[TENANT_HEADER] = request.tenant
        return headers


def is_chat_endpoint(path: str) -> bool:
    return path.rstrip("/").endswith("/chat/completions")


def chat_prompt(seed: int, index: int, num_words: int) -> str:
    """The user message of request `index`: `num_words` common words, made when it is sent."""
    rng = np.random.default_rng([seed, 3, index])
    return " ".join(CHAT_WORDS[i] for i in rng.integers(0, len(CHAT_WORDS), size=num_words))


def request_fields(model: str | None, ttft_slo: float | None, tbt_slo: float | None,
                   priority: int = 0) -> dict:
    """The JSON fields every request carries (all but the prompt and max_tokens)."""
    fields = {"stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
              "temperature": 0.0, "priority": priority, "return_serving_info": True}
    optional = {"model": model, "ttft_slo": ttft_slo, "tbt_slo": tbt_slo}
    return {**fields, **{k: v for k, v in optional.items() if v is not None}}


def auth_headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


#: Seconds to wait for answers after the last arrival; what is unanswered then is lost.
ANSWER_TIMEOUT = 300.0


async def run_load(url: str, workload: list[WorkloadRequest], *, ttft_slo: float | None = None,
                   tbt_slo: float | None = None, model: str | None = None, seed: int = 0,
                   api_key: str = "", endpoint: str = "/v1/completions",
                   timeout: float = ANSWER_TIMEOUT, max_concurrency: int | None = None,
                   priority: int = 0, progress: bool = True,
                   stop: asyncio.Event | None = None) -> LoadRun:
    """Send `workload` to the server at `url` open-loop; one record per request. Once
    `stop` is set (Ctrl-C) nothing more is sent, what is in flight is cancelled, and the
    run keeps only the requests that had finished (`LoadRun.interrupted`)."""
    bar = Progress(len(workload), enabled=progress)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, headers=auth_headers(api_key),
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:
        client = Client(session, url.rstrip("/") + endpoint,
                        request_fields(model, ttft_slo, tbt_slo, priority), seed, bar, max_concurrency)
        records = [RequestRecord(index=w.index, arrival=w.arrival, prompt_len=w.prompt_len,
                                 output_len=w.output_len, scheduled=w.arrival,
                                 ttft_slo=w.ttft_slo, tbt_slo=w.tbt_slo, slo_class=w.slo_class,
                                 warmup=w.warmup, tenant=w.tenant,
                                 priority=w.priority or priority)
                   for w in workload]
        try:
            started = await _dispatch(client, workload, records, timeout, stop)
        finally:
            bar.close()
        if stop is not None and stop.is_set():
            finished = [r for r in records if r.end_time is not None]
            return LoadRun(finished, _span(finished), interrupted=len(records),
                           sent=records[:started])
        return LoadRun(records, _span(records))


def _span(records: list[RequestRecord]) -> float:
    return max((t for r in records for t in (r.arrival, r.end_time) if t is not None), default=0.0)


async def _dispatch(client: Client, workload: list[WorkloadRequest],
                    records: list[RequestRecord], timeout: float,
                    stop: asyncio.Event | None = None) -> int:
    """Start each request at its offset; then wait (bounded) for the answers -- or until
    `stop` is set. Returns how many were sent (the first ones)."""
    stop = stop or asyncio.Event()
    stopped = asyncio.ensure_future(stop.wait())
    tasks = []
    try:
        for request, record in zip(workload, records):
            delay = request.arrival - client.now()
            if delay > 0:
                await asyncio.wait([stopped], timeout=delay)
            if stop.is_set():
                break
            tasks.append(asyncio.create_task(_send(client, request, record)))
        deadline = (workload[-1].arrival if workload else 0.0) + timeout
        if tasks and not stop.is_set():
            answers = asyncio.ensure_future(asyncio.wait(tasks))
            await asyncio.wait([answers, stopped], timeout=max(0.0, deadline - client.now()),
                               return_when=asyncio.FIRST_COMPLETED)
            answers.cancel()
    finally:
        stopped.cancel()
        for task in tasks:
            task.cancel()  # what is still running is lost
        await asyncio.gather(*tasks, return_exceptions=True)
    return len(tasks)


async def _send(client: Client, request: WorkloadRequest, record: RequestRecord) -> None:
    if client.slots is None:
        await _post(client, request, record)
        return
    async with client.slots:
        await _post(client, request, record)


async def _post(client: Client, request: WorkloadRequest, record: RequestRecord) -> None:
    body = client.body(request)
    record.arrival = client.now()
    try:
        async with client.session.post(client.url, data=body,
                                       headers=client.headers(request)) as response:
            if response.status != 200:
                _http_error(record, response.status, await response.read(), client.now())
            else:
                await _read_stream(client, response, record)
    except asyncio.CancelledError:
        raise  # the run's deadline: the record stays `lost`
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        if record.outcome != "completed":  # a broken connection after the finish is no error
            _fail(record, {"message": f"{type(exc).__name__}: {exc}"}, client.now())
    client.progress.update(record.outcome)


async def _read_stream(client: Client, response: aiohttp.ClientResponse,
                       record: RequestRecord) -> None:
    async for data in sse_data(response.content):
        now = client.now()
        if data.strip() == "[DONE]":
            break
        event = json.loads(data)
        if not isinstance(event, dict):
            raise ValueError(f"an SSE event that is not a JSON object: {data[:200]!r}")
        on_serving_info(record, event.get("serving_info"))
        if "error" in event:
            _fail(record, event["error"], now)
            return
        _on_chunk(record, event, now, client.chat)
    if record.outcome != "completed":
        _fail(record, {"message": "the stream ended without a finish reason"}, client.now())


def _on_chunk(record: RequestRecord, event: dict, now: float, chat: bool = False) -> None:
    usage = event.get("usage")
    if usage and usage.get("completion_tokens") is not None:
        record.num_output_tokens = int(usage["completion_tokens"])
    if chat and usage and usage.get("prompt_tokens") is not None:
        record.prompt_len = int(usage["prompt_tokens"])  # words are not tokens: the server's count
    if usage and (usage.get("prompt_tokens_details") or {}).get("cached_tokens") is not None:
        record.cached_tokens = int(usage["prompt_tokens_details"]["cached_tokens"])
    choices = event.get("choices") or []
    if not choices:
        return
    if record.first_token_time is None:
        record.first_token_time = now
    record.token_times.append(now)
    finish = choices[0].get("finish_reason")
    if finish:
        record.finish_reason, record.end_time, record.outcome = finish, now, "completed"


def on_serving_info(record: RequestRecord, raw) -> None:
    """Where the daemon served it (`serving_info`, its one choice: index 0) into `record`;
    nothing when absent (another server) or not that shape."""
    if raw is None:
        return
    try:
        info = msgspec.convert(raw, ServingInfo)
    except msgspec.ValidationError:
        return
    served = next((c for c in info.choices if c.index == 0), None)
    if served is None:
        return
    record.instances, record.offloaded, record.role = served.instances, served.offloaded, served.role
    record.instance = served.instances[-1] if served.instances else None
    record.sched_delay = served.queue_delay


def _http_error(record: RequestRecord, status: int, raw: bytes, now: float) -> None:
    try:
        body = json.loads(raw)
        on_serving_info(record, body.get("serving_info") if isinstance(body, dict) else None)
        error = body["error"]
        error = error if isinstance(error, dict) else {"message": str(error)}
    except (ValueError, KeyError, TypeError):
        error = {"message": raw.decode("utf-8", "replace")[:500]}
    record.http_status = status
    _fail(record, {**error, "message": f"HTTP {status}: {error.get('message')}",
                   "code": error.get("code") or error.get("type") or f"http_{status}"}, now)


def _fail(record: RequestRecord, error: dict, now: float) -> None:
    record.error, record.error_code, record.end_time = error.get("message"), error.get("code"), now
    record.outcome = failure_outcome(record.error_code)


async def get_json(url: str, path: str, api_key: str = "", timeout: float = 10.0):
    """GET url+path as JSON, whatever the status (/health answers 503 while degraded)."""
    async with aiohttp.ClientSession(headers=auth_headers(api_key),
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        async with session.get(url.rstrip("/") + path) as response:
            return await response.json(content_type=None)


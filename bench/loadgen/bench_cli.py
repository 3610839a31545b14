"""`ascendra bench`: flags, then a whole load-test run.

A run: ask the server its model and context length (/v1/models), build the workload
(bench/loadgen/workloads.py, from the flags of bench/loadgen/workload_flags.py), send it open-loop
(bench/loadgen/loadgen.py), read /health for the per-instance part, summarize (bench/records/results.py),
print the table, write the JSON (and `--records`, one line per request). Flag names
follow `vllm bench serve` where one exists (the aliases).

Failed requests (errored, or lost: no answer by the deadline) count against goodput like
any miss, so a few are part of the measurement; a request the server shed under load
(dropped: `ttft_slo_missed`, `queue_full`) is a miss but no failure. Any
failure is reported on stderr with its count and the commonest messages; more than
`--max-error-rate` of the requests failing (default 10 %; all of them, always) makes the
run exit 1: then the setup, not the server's speed, is what was measured.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import sys
from pathlib import Path

import aiohttp
import msgspec

from bench.loadgen.chat_fit import fit_chat_prompts
from bench.loadgen.loadgen import (
    ANSWER_TIMEOUT, LoadRun, get_json, is_chat_endpoint, run_load,
)
from bench.loadgen.tenant_mix import mix_text, tenant_rates
from bench.loadgen.workload_flags import add_workload_flags, workload_spec
from bench.loadgen.workloads import build_requests, num_requests_or
from bench.records.schema import RequestRecord
from bench.records.records_file import record_rows, write_records
from bench.records.br_report import br02_report
from bench.records.br_report import now as report_now
from bench.records.results import RunResult, arrival_window, print_summary, summarize, write_result
from bench.records.vllm_result import (
    DEFAULT_METRIC_PERCENTILES, DEFAULT_PERCENTILE_METRICS, parse_goodput,
    parse_metric_percentiles, parse_percentile_metrics, result_path, vllm_result,
    write_vllm_result,
)
from daemon.core.controller_config import SloConfig
from daemon.health import Health

DEFAULT_NUM_REQUESTS = 1000
#: The daemon's own default SLOs: a run with no --ttft-slo/--tbt-slo measures against them.
DEFAULT_SLO = SloConfig()
DEFAULT_MAX_ERROR_RATE = 0.1
#: `--report` formats, and the file one is written to unless told.
REPORT_FORMATS = ("br0.2",)
REPORT_FILE = "benchmark_report_br0.2.json"
#: Tokens a chat template adds around a message (role headers, BOS/EOS): the room a chat
#: run leaves in the context beyond the prompt's words and the output.
CHAT_TEMPLATE_TOKENS = 32
#: Distinct error messages printed after a run with failures.
ERRORS_SHOWN = 5
#: Flags left out of the result's `config` (secrets, output choices).
NOT_CONFIG = ("api_key", "json", "save_detailed", "progress", "run", "command",
              "max_error_rate", "records", "save_result", "result_dir", "result_filename",
              "goodput_ms", "percentile_names", "percentile_values", "report", "report_file")
DESCRIPTION = ("Send a trace's requests open-loop to an OpenAI-compatible server (streaming) "
               "and report TTFT, TBT, goodput and throughput.")


def add_bench_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", "--base-url", dest="url", default="http://127.0.0.1:8000",
                   help="the server (default %(default)s)")
    p.add_argument("--endpoint", default="/v1/completions",
                   help="/v1/completions (token-id prompts) or /v1/chat/completions (a user "
                        "message of common words) (default %(default)s)")
    p.add_argument("--trace", "--dataset-name", "--dataset-path", dest="trace", default="sharegpt",
                   help="sharegpt | arxiv | azure-conv (with arrival times) | a .csv/.jsonl file "
                        "with prompt and output token counts (and optionally arrival_time) "
                        "(default %(default)s)")
    p.add_argument("--qps", "--request-rate", dest="qps", type=float, default=None,
                   help="mean arrival rate, requests/s; inf sends all at once (default inf; a "
                        "replayed trace: its own times, or --qps rescales them to this rate)")
    p.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the gaps: 1 = Poisson, < 1 burstier (default %(default)s)")
    add_workload_flags(p)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--num-requests", "--num-prompts", dest="num_requests", type=int,
                      help=f"requests to send (default {DEFAULT_NUM_REQUESTS})")
    size.add_argument("--duration", type=float, help="send every arrival within this many seconds")
    p.add_argument("--ttft-slo", type=float, default=DEFAULT_SLO.ttft_slo,
                   help="seconds (default %(default)s)")
    p.add_argument("--tbt-slo", type=float, default=DEFAULT_SLO.tbt_slo,
                   help="seconds (default %(default)s)")
    p.add_argument("--priority", type=int, default=0, help="priority class sent with each request")
    p.add_argument("--seed", type=int, default=0, help="arrivals, sampling and prompts (default 0)")
    p.add_argument("--model", help="model name to send (default: the server's first)")
    p.add_argument("--api-key", default=None, help="bearer key (default $ASCENDRA_API_KEY)")
    p.add_argument("--max-concurrency", type=int, help="cap on requests in flight (default none)")
    p.add_argument("--max-model-len", type=int,
                   help="clamp prompt + output to this (default: the server's; 0 = no clamp)")
    p.add_argument("--length-scale", type=float, default=1.0,
                   help="divide the trace's lengths by this (default %(default)s)")
    p.add_argument("--timeout", type=float, default=ANSWER_TIMEOUT,
                   help="seconds to wait for answers after the last arrival; what is still "
                        "unanswered then is lost (default %(default)s)")
    p.add_argument("--json", dest="json", metavar="PATH",
                   help="write the result (the schema `simulate` writes too) to PATH")
    p.add_argument("--save-detailed", action="store_true",
                   help="include every request's record (--json) and vLLM's per-request "
                        "lists (--save-result)")
    add_vllm_result_flags(p)
    p.add_argument("--records", metavar="FILE",
                   help="write one line per request to FILE (JSONL, or .parquet); read it with "
                        "`ascendra records FILE`")
    p.add_argument("--max-error-rate", type=float, default=DEFAULT_MAX_ERROR_RATE,
                   help="exit 1 when more than this fraction of the requests fail (errored or "
                        "lost) (default %(default)s)")
    p.add_argument("--disable-tqdm", "--no-progress", dest="progress", action="store_false",
                   help="no progress bar")


def add_vllm_result_flags(p: argparse.ArgumentParser) -> None:
    """`vllm bench serve`'s result flags, with its meanings (bench/records/vllm_result.py)."""
    p.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                   help="SLOs for goodput as vllm bench serve takes them: ttft:MS tpot:MS "
                        "e2el:MS (ttft and tpot replace --ttft-slo / --tbt-slo)")
    p.add_argument("--percentile-metrics", default=DEFAULT_PERCENTILE_METRICS,
                   help="metrics --save-result reports percentiles of: ttft,tpot,itl,e2el "
                        "(default %(default)s)")
    p.add_argument("--metric-percentiles", default=DEFAULT_METRIC_PERCENTILES,
                   help="comma-separated percentiles, e.g. 50,90,99 (default %(default)s)")
    p.add_argument("--save-result", action="store_true",
                   help="write vllm bench serve's result JSON (its field names), named as "
                        "vLLM names it unless --result-filename")
    p.add_argument("--result-dir", help="folder of the --save-result file (default: here)")
    p.add_argument("--result-filename", help="name of the --save-result file")
    p.add_argument("--report", choices=REPORT_FORMATS,
                   help="also write llm-d-benchmark's benchmark report (schema 0.2) to "
                        "--report-file")
    p.add_argument("--report-file", default=None,
                   help="the --report file (default benchmark_report_br0.2.json in "
                        "--result-dir, else here)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ascendra bench", description=DESCRIPTION)
    add_bench_flags(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    _check(args)
    raise_open_files_limit()
    result, records = asyncio.run(_benchmark(args))
    print_summary(result)
    if args.json:
        write_result(result, args.json)
        print(f"result written to {args.json}")
    if args.save_result:
        path = save_vllm_result(args, result, records)
        print(f"vllm bench serve result written to {path}")
    if args.report:
        path = Path(args.report_file or Path(args.result_dir or ".") / REPORT_FILE)
        report = br02_report(records, result.duration_s, end=report_now(),
                             description=f"ascendra bench {result.config.get('workload', {})}"
                                         .strip()[:500])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(msgspec.json.encode(report))
        print(f"benchmark report ({args.report}) written to {path}")
    if args.records:
        write_records(args.records, record_rows(records, args.ttft_slo, args.tbt_slo))
        print(f"records written to {args.records}")
    return report_failures(records, args.max_error_rate, timeout=args.timeout)


def report_failures(records: list[RequestRecord], max_error_rate: float, file=None,
                    timeout: float = ANSWER_TIMEOUT) -> int:
    """Print the failures (stderr) with their commonest messages; the run's exit code.

    A lost request says whether it had started streaming (the server was still generating
    when the run's deadline came) and what to change: the server is slower than the
    offered load, so a lower --qps or a longer --timeout."""
    file = file or sys.stderr
    failed = [r for r in records if r.outcome in ("errored", "lost")]
    if not failed:
        return 0
    rate = len(failed) / len(records)
    errored = sum(r.outcome == "errored" for r in failed)
    print(f"\n*** {len(failed)} of {len(records)} requests FAILED ({100 * rate:.1f} %): "
          f"{errored} errored, {len(failed) - errored} lost ***", file=file)
    messages: dict[str, int] = {}
    for r in failed:
        text = r.error or _lost_message(r, timeout)
        messages[text] = messages.get(text, 0) + 1
    for text, count in sorted(messages.items(), key=lambda kv: -kv[1])[:ERRORS_SHOWN]:
        print(f"  {count:>6} x {text[:300]}", file=file)
    if rate >= 1.0 or rate > max_error_rate:
        print(f"bench: {100 * rate:.1f} % of the requests failed, over --max-error-rate "
              f"{max_error_rate:g}: exit 1", file=file)
        return 1
    return 0


def _lost_message(record: RequestRecord, timeout: float) -> str:
    started = ("still streaming" if record.first_token_time is not None
               else "no first token")
    return (f"{started} {timeout:g} s after the last arrival (--timeout): the server is "
            f"slower than the offered load; lower --qps or raise --timeout")


def save_vllm_result(args: argparse.Namespace, result: RunResult,
                     records: list[RequestRecord]):
    """The run as `vllm bench serve --save-result` writes it; returns the file's path."""
    backend = "openai-chat" if is_chat_endpoint(args.endpoint) else "openai"
    rate = args.qps if args.qps is not None else float("inf")
    model = result.config.get("model") or "unknown"
    body = vllm_result(records, result.duration_s, backend=backend, model=model,
                       num_prompts=result.num_requests, request_rate=rate,
                       burstiness=args.burstiness, max_concurrency=args.max_concurrency,
                       goodput=args.goodput_ms, percentile_metrics=args.percentile_names,
                       metric_percentiles=args.percentile_values, detailed=args.save_detailed)
    path = result_path(args.result_dir, args.result_filename, backend, rate, model,
                       args.max_concurrency, body["date"])
    write_vllm_result(body, path)
    return path


def _check(args: argparse.Namespace) -> None:
    """Flag mistakes, before anything is sent; `--goodput` resolved into the SLOs."""
    args.goodput_ms = parse_goodput(args.goodput or [])
    args.percentile_names = parse_percentile_metrics(args.percentile_metrics)
    args.percentile_values = parse_metric_percentiles(args.metric_percentiles)
    if "ttft" in args.goodput_ms:
        args.ttft_slo = args.goodput_ms["ttft"] / 1000
    if "tpot" in args.goodput_ms:
        args.tbt_slo = args.goodput_ms["tpot"] / 1000
    args.e2el_slo = args.goodput_ms["e2el"] / 1000 if "e2el" in args.goodput_ms else None
    if not 0.0 <= args.max_error_rate <= 1.0:
        raise ValueError(f"--max-error-rate must be 0..1, got {args.max_error_rate}")
    positive = {"--qps": args.qps, "--burstiness": args.burstiness, "--timeout": args.timeout,
                "--ttft-slo": args.ttft_slo, "--tbt-slo": args.tbt_slo,
                "--length-scale": args.length_scale, "--duration": args.duration,
                "--num-requests": args.num_requests, "--max-concurrency": args.max_concurrency}
    for flag, value in positive.items():
        if value is not None and not value > 0:
            raise ValueError(f"{flag} must be > 0, got {value}")


def raise_open_files_limit() -> None:
    """One socket per request in flight: lift the soft limit on open files to the hard one."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


async def benchmark(args: argparse.Namespace) -> RunResult:
    """One run as the flags say; returns the summarized result."""
    return (await _benchmark(args))[0]


async def _benchmark(args: argparse.Namespace) -> tuple[RunResult, list[RequestRecord]]:
    api_key = args.api_key if args.api_key is not None else os.environ.get("ASCENDRA_API_KEY", "")
    spec = workload_spec(args)  # the flags' mistakes before the server's
    info = await server_info(args.url, api_key)
    max_len = args.max_model_len if args.max_model_len is not None else info.get("max_model_len")
    fit = max_len
    if max_len and is_chat_endpoint(args.endpoint):
        fit = max(max_len - CHAT_TEMPLATE_TOKENS, 2)
    num = args.num_requests or (None if args.duration
                                else num_requests_or(spec, DEFAULT_NUM_REQUESTS))
    rate = args.qps if args.qps is not None or spec.arrival == "replay" else float("inf")
    workload = build_requests(spec, rate=rate, num_requests=num, duration=args.duration,
                              seed=args.seed, max_model_len=fit or None)
    model = args.model or info.get("id")
    if spec.tenant_mix:
        print(mix_text(spec.tenant_mix, rate))
    if max_len and is_chat_endpoint(args.endpoint):
        fitted = await fit_chat_prompts(args.url, api_key, model, workload, max_len, args.seed)
        workload = fitted.requests
        print(f"chat prompts fitted to the server's context ({max_len} tokens) by its own "
              f"count (POST /tokenize): {fitted.trimmed} trimmed, {fitted.skipped} skipped"
              if fitted.counted else "the server has no /tokenize: chat prompts are fitted "
              "by an estimate, and some may exceed its context", file=sys.stderr)
    before = await _health(args.url, api_key)
    stop = _stop_on_ctrl_c()
    load = await run_load(args.url, workload, ttft_slo=args.ttft_slo, tbt_slo=args.tbt_slo,
                          model=model, seed=args.seed, api_key=api_key, endpoint=args.endpoint,
                          timeout=args.timeout, max_concurrency=args.max_concurrency,
                          priority=args.priority, progress=args.progress, stop=stop)
    if load.interrupted:
        print(f"bench: interrupted (Ctrl-C): {len(load.records)} of {load.interrupted} "
              "requests had finished; the summary and the files below are theirs (those in "
              "flight and those not yet sent are left out)", file=sys.stderr)
    _warn_if_late(load)
    _warn_if_chunked(load)
    health = await _health(args.url, api_key)
    config = {k: v for k, v in vars(args).items() if k not in NOT_CONFIG and not callable(v)}
    config.update(tool="bench", model=model, max_model_len=max_len or None,
                  num_requests=len(workload), workload=msgspec.to_builtins(spec))
    if load.interrupted:
        config["interrupted_after_finished"] = len(load.records)
    if spec.tenant_mix and rate is not None and math.isfinite(rate):
        config["tenant_rates"] = tenant_rates(spec.tenant_mix, rate)
    result = summarize(load.records, config, load.duration_s, args.ttft_slo, args.tbt_slo,
                       per_instance=this_run(before, health),
                       perf_model_mape=health.perf_model_mape if health else None,
                       keep_records=args.save_detailed,
                       e2el_slo=getattr(args, "e2el_slo", None))
    if load.interrupted:  # the rate offered is that of every request sent, not the finished
        sent = arrival_window(load.sent)
        result = msgspec.structs.replace(result, arrival_window_s=sent.get("arrival_window_s", 0.0),
                                         offered_rps=sent.get("offered_rps", 0.0))
    return result, load.records


def _stop_on_ctrl_c() -> asyncio.Event:
    """Set on the first Ctrl-C (SIGINT): the run stops sending and keeps what finished; a
    second Ctrl-C interrupts at once, as usual."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def first() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)

    try:
        loop.add_signal_handler(signal.SIGINT, first)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or Windows
        pass
    return stop


async def server_info(url: str, api_key: str) -> dict:
    """The first model /v1/models lists (`id`, `max_model_len` when the server says)."""
    try:
        body = await get_json(url, "/v1/models", api_key)
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
        raise ValueError(f"cannot reach the server at {url}: {exc or type(exc).__name__}") from None
    if isinstance(body, dict) and "error" in body:
        raise ValueError(f"{url}/v1/models: {body['error'].get('message', body['error'])}")
    models = body.get("data") if isinstance(body, dict) else None
    return models[0] if models else {}


#: /health's per-instance counts since the daemon started: a run reports its own share.
RUN_COUNTS = ("served", "offloaded", "dropped", "preemptions", "restarts")


def this_run(before: Health | None, after: Health | None) -> list[dict]:
    """Each instance's /health after the run, its counts (RUN_COUNTS) less those before
    it: what this run's requests did, not everything since the daemon started."""
    if after is None:
        return []
    earlier = {i.id: i for i in before.instances} if before is not None else {}
    rows = []
    for instance in after.instances:
        row = msgspec.to_builtins(instance)
        if instance.id in earlier:
            for count in RUN_COUNTS:
                row[count] -= getattr(earlier[instance.id], count)
        rows.append(row)
    return rows


async def _health(url: str, api_key: str) -> Health | None:
    """The server's /health as the daemon writes it (daemon.health.Health); None when it
    has none or another server's shape (bench runs against any OpenAI server)."""
    try:
        body = await get_json(url, "/health", api_key)
        return msgspec.convert(body, Health)
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError,
            msgspec.ValidationError):
        return None


def _warn_if_late(load: LoadRun) -> None:
    """An open-loop client that could not keep its schedule measures a lighter load."""
    lags = [r.arrival - r.scheduled for r in load.records if r.scheduled is not None]
    if lags and max(lags) > 0.1:
        print(f"warning: requests were sent up to {max(lags):.2f} s after their arrival time "
              f"(the client could not keep up, or --max-concurrency held them)", file=sys.stderr)


def _warn_if_chunked(load: LoadRun) -> None:
    """Per-gap TBT is per SSE chunk; say so when chunks carried several tokens each."""
    done = [r for r in load.records if r.outcome == "completed"]
    chunks, tokens = sum(len(r.token_times) for r in done), sum(r.output_tokens() for r in done)
    if tokens and chunks < 0.9 * tokens:
        print(f"warning: the server sent {chunks} chunks for {tokens} tokens; TBT gaps are "
              f"measured per chunk (mean TBT and goodput use the token counts)", file=sys.stderr)

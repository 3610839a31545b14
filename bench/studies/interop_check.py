"""The interop cross-check (docs/interop.md): one Mooncake trace, replayed at its own
times through `ascendra bench` and through the load testers people already use --
aiperf, guidellm (and inference-perf, where its Python allows) -- each against a fresh
daemon of the same configuration; their request counts, TTFT / TPOT percentiles and
goodput side by side.

    python -m bench.studies.interop_check [--requests 120] [--rate 2] [--out DIR]
        [--aiperf PATH] [--guidellm PATH] [--ttft-ms 300] [--tpot-ms 30]

The daemon: `ascendra serve --executor sim --profile a100-llama3-8b --max-model-len 8192`
(the tiny model's tokenizer, an A100's step times, no GPU). The trace: `--requests`
Poisson arrivals at `--rate`, each prompt two blocks of one of six shared prefixes and
1-4 blocks of its own (Mooncake's 512-token `hash_ids`), so the prefix cache matters;
written to DIR/mooncake.jsonl. Each tool gets the file as it is (`ascendra bench
--workload replay`, `aiperf --custom-dataset-type mooncake_trace --fixed-schedule`,
`guidellm --data kind=mooncake --profile kind=replay`). TPOT is vLLM's -- (latency -
TTFT) / (output tokens - 1) -- which aiperf calls inter-token latency and guidellm
`inter_token_latency_ms` (guidellm's `time_per_output_token_ms` is latency / tokens,
first token included). A request is good within `--ttft-ms` and `--tpot-ms`.
A tool that is not installed is left out, and the table says so. Beside each tool's
figures, the daemon's own (its --request-log) for the same requests: a gap between the
two is the client's; a change in both is the server's (e.g. slowed by the tool's own CPU
use on a small machine).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench.launch.daemon_launcher import ServeProcess

PROFILE = "a100-llama3-8b"
SERVE_ARGS = ["--executor", "sim", "--profile", PROFILE, "--max-model-len", "8192",
              "--max-queued-requests", "100000", "--max-queued-tokens", "1000000000"]
#: The fake commit of the tokenizer snapshot aiperf reads (it resolves only hub-cache
#: snapshots when offline, never a plain folder).
SNAPSHOT = "0" * 40


def mooncake_trace(n: int, rate: float, seed: int = 7) -> list[dict]:
    """Rows of a Mooncake trace (module docstring)."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1 / rate, n))
    times -= times[0]
    rows = []
    for i, t in enumerate(times):
        group, own = int(rng.integers(0, 6)), int(rng.integers(1, 5))
        ids = [100 * group, 100 * group + 1] + [10_000 + 10 * i + k for k in range(own)]
        rows.append({"timestamp": int(round(1000 * t)),
                     "input_length": 512 * (len(ids) - 1) + int(rng.integers(64, 512)),
                     "output_length": int(rng.integers(32, 256)), "hash_ids": ids})
    return rows


def row(tool: str, requests: int, completed: int, ttft: list[float], tpot: list[float],
        good: int, cached_pct: float | None, note: str = "") -> dict:
    """One line of the table: percentiles in ms over completed requests."""
    p = (lambda v, q: float(np.percentile(v, q)) if len(v) else None)
    return {"tool": tool, "requests": requests, "completed": completed,
            "ttft_p50": p(ttft, 50), "ttft_p90": p(ttft, 90), "ttft_p99": p(ttft, 99),
            "tpot_p50": p(tpot, 50), "tpot_p90": p(tpot, 90),
            "goodput_pct": 100.0 * good / requests if requests else 0.0,
            "cached_pct": cached_pct, "note": note}


def _good(ttft: list[float], tpot: list[float], ttft_ms: float, tpot_ms: float) -> int:
    return sum(t <= ttft_ms and o <= tpot_ms for t, o in zip(ttft, tpot))


def _cached_pct(url: str) -> float | None:
    """The daemon's prompt tokens found cached, % (ascendra_prompt_tokens{,_cached})."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    totals = {f.name: sum(s.value for s in f.samples if s.name.endswith("_total"))
              for f in text_string_to_metric_families(text)
              if f.name in ("ascendra_prompt_tokens", "ascendra_prompt_tokens_cached")}
    prompt = totals.get("ascendra_prompt_tokens", 0)
    return 100.0 * totals.get("ascendra_prompt_tokens_cached", 0) / prompt if prompt else None


def run_ascendra(url: str, trace: Path, out: Path, a: argparse.Namespace) -> dict:
    saved = out / "ascendra_vllm.json"
    subprocess.run([sys.executable, "-m", "daemon.cli", "bench", "--url", url, "--workload",
                    "replay", "--trace", str(trace), "--goodput", f"ttft:{a.ttft_ms}",
                    f"tpot:{a.tpot_ms}", "--save-result", "--save-detailed", "--result-dir",
                    str(out), "--result-filename", saved.name, "--report", "br0.2",
                    "--disable-tqdm",
                    "--max-error-rate", "1"], check=True, stdout=subprocess.DEVNULL)
    r = json.loads(saved.read_text())
    done = [i for i, e in enumerate(r["errors"]) if not e]
    ttft = [1000 * r["ttfts"][i] for i in done]
    tpot = [1000 * (r["latencies"][i] - r["ttfts"][i]) / (r["output_lens"][i] - 1)
            if r["output_lens"][i] > 1 else 0.0 for i in done]
    return row("ascendra bench", len(r["errors"]), r["completed"], ttft, tpot,
               _good(ttft, tpot, a.ttft_ms, a.tpot_ms), None)


def _hf_snapshot(model: str, folder: str, home: Path) -> str:
    """A hub-cache snapshot of the daemon's tokenizer under `home`; its repo id."""
    repo = f"ascendra/{model}"
    root = home / "hub" / f"models--ascendra--{model}"
    snap = root / "snapshots" / SNAPSHOT
    snap.mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(SNAPSHOT)
    for name in os.listdir(folder):
        if name.endswith(".json"):
            shutil.copy(Path(folder) / name, snap / name)
    return repo


def run_aiperf(url: str, trace: Path, out: Path, a: argparse.Namespace, model: str,
               folder: str) -> dict:
    home = out / "hf"
    repo = _hf_snapshot(model, folder, home)
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    subprocess.run([a.aiperf, "profile", "--model", model, "--url", url, "--endpoint-type",
                    "completions", "--streaming", "--input-file", str(trace),
                    "--custom-dataset-type", "mooncake_trace", "--fixed-schedule",
                    "--tokenizer", repo, "--extra-inputs", "ignore_eos:true",
                    "--use-server-token-count", "--artifact-dir", str(out / "aiperf"),
                    "--ui-type", "none", "--random-seed", "0"], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = [json.loads(line) for line in
               (out / "aiperf" / "profile_export.jsonl").read_text().splitlines() if line]
    ok = [r["metrics"] for r in records if not r.get("error")]
    ttft = [m["time_to_first_token"]["value"] for m in ok]
    tpot = [m["inter_token_latency"]["value"] for m in ok]
    return row("aiperf", len(records), len(ok), ttft, tpot,
               _good(ttft, tpot, a.ttft_ms, a.tpot_ms), None)


def run_guidellm(url: str, trace: Path, out: Path, a: argparse.Namespace, folder: str) -> dict:
    path = out / "guidellm.json"
    data = {"kind": "mooncake", "source": {"kind": "json_file", "path": str(trace)},
            "time_scale": 0.001}   # its trace times are seconds; Mooncake's are ms
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(out / "hf"), "COLUMNS": "200"}
    subprocess.run([a.guidellm, "run", "--backend",
                    f"kind=openai_http,target={url},request_format=/v1/completions",
                    "--profile", "kind=replay,schedule_turn=timestamp", "--data",
                    json.dumps(data), "--tokenizer", f"kind=huggingface_auto,model={folder}",
                    "--output", f"kind=json,path={path}", "--disable-progress"],
                   check=True, env=env, cwd=out, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    bench = json.loads(path.read_text())["benchmarks"][0]
    ok = bench["requests"]["successful"]
    ttft = [r["time_to_first_token_ms"] for r in ok]
    tpot = [r["inter_token_latency_ms"] for r in ok]
    totals = bench["metrics"]["request_totals"]
    return row("guidellm", totals["total"], len(ok), ttft, tpot,
               _good(ttft, tpot, a.ttft_ms, a.tpot_ms), None)


def server_side(log: Path) -> dict:
    """The daemon's own view of the same requests (its --request-log): TTFT and TPOT
    percentiles, ms, over completed requests -- what the server did, whatever the client
    saw."""
    from daemon.request_log import read_request_log
    done = [e for e in read_request_log(str(log)) if e.outcome == "completed"
            and e.ttft is not None and e.e2e is not None]
    ttft = [1000 * e.ttft for e in done]
    tpot = [1000 * (e.e2e - e.ttft) / (e.output_tokens - 1) for e in done if e.output_tokens > 1]
    p = (lambda v, q: float(np.percentile(v, q)) if v else None)
    return {"server_ttft_p50": p(ttft, 50), "server_ttft_p90": p(ttft, 90),
            "server_tpot_p50": p(tpot, 50)}


def one(tool: str, trace: Path, out: Path, a: argparse.Namespace) -> dict:
    """`tool`'s row, run against a daemon of its own (a cold prefix cache each), with the
    daemon's own percentiles beside the tool's."""
    log = out / f"requests_{tool}.jsonl"
    with ServeProcess([*SERVE_ARGS, "--request-log", str(log)], start_timeout=180,
                      log_path=out / f"daemon_{tool}.log") as d:
        model_info = json.loads(urllib.request.urlopen(d.url + "/v1/models").read())["data"][0]
        model, folder = model_info["id"], str(Path.home() / ".cache" / "ascendra" / model_info["id"])
        if tool == "ascendra":
            result = run_ascendra(d.url, trace, out, a)
        elif tool == "aiperf":
            result = run_aiperf(d.url, trace, out, a, model, folder)
        else:
            result = run_guidellm(d.url, trace, out, a, folder)
        result["cached_pct"] = _cached_pct(d.url)
    result.update(server_side(log))
    return result


def table(rows: list[dict]) -> str:
    fmt = (lambda v: "-" if v is None else f"{v:.1f}")
    lines = ["| tool | requests | completed | TTFT p50 / p90 / p99 ms | TPOT p50 / p90 ms | "
             "goodput % | prompt cached % | daemon's TTFT p50 / p90, TPOT p50 ms |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['tool']} | {r['requests']} | {r['completed']} | "
                     f"{fmt(r['ttft_p50'])} / {fmt(r['ttft_p90'])} / {fmt(r['ttft_p99'])} | "
                     f"{fmt(r['tpot_p50'])} / {fmt(r['tpot_p90'])} | {fmt(r['goodput_pct'])} | "
                     f"{fmt(r['cached_pct'])} | {fmt(r.get('server_ttft_p50'))} / "
                     f"{fmt(r.get('server_ttft_p90'))}, {fmt(r.get('server_tpot_p50'))} |")
    return "\n".join(lines)


def _beside_python(name: str) -> str | None:
    return shutil.which(name, path=str(Path(sys.executable).parent))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=120)
    p.add_argument("--rate", type=float, default=2.0, help="requests/s of the trace")
    p.add_argument("--ttft-ms", type=float, default=300.0)
    p.add_argument("--tpot-ms", type=float, default=30.0)
    p.add_argument("--aiperf", default=shutil.which("aiperf"), help="aiperf's command")
    p.add_argument("--guidellm", default=_beside_python("guidellm") or shutil.which("guidellm"))
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    out = a.out or Path(tempfile.mkdtemp(prefix="interop-"))
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "mooncake.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in mooncake_trace(a.requests, a.rate)))
    tools = ["ascendra"] + [t for t in ("aiperf", "guidellm") if getattr(a, t)]
    rows = []
    for tool in tools:
        rows.append(one(tool, trace, out, a))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    missing = [t for t in ("aiperf", "guidellm") if not getattr(a, t)]
    (out / "summary.json").write_text(json.dumps({"rows": rows, "missing": missing}, indent=2))
    print(table(rows))
    if missing:
        print(f"not installed, left out: {', '.join(missing)}")
    print(f"files in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

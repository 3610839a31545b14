"""Third-party load testers against the real daemon on the sim executor: guidellm (from the
`test` extra) measures non-zero TTFT and ITL with no errors, given the model folder the
daemon logs as its tokenizer; the official `openai` client gets one text chunk per token.

Covers: daemon/api.py, daemon/openapi.py.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from tests.daemon_fixture import sim_args

pytestmark = pytest.mark.slow

MAX_TOKENS = 32
#: The line `ascendra serve` logs after "serving ...": the folder clients take as tokenizer.
_FOLDER = re.compile(r"model and tokenizer folder: (\S+)")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, daemon_cache, tiny_models):
    from tests.daemon_fixture import start_daemon
    d = start_daemon(tmp_path_factory.mktemp("load-testers"), "--model",
                     str(tiny_models["llama"]), *sim_args(latency="constant:0.01"),
                     cache_dir=daemon_cache)
    yield d
    d.close()


def tokenizer_folder(daemon) -> str:
    match = _FOLDER.search(daemon.log())
    assert match, "serve does not log the model and tokenizer folder:\n" + daemon.log()
    return match.group(1)


def test_serve_logs_the_tokenizer_folder(daemon, tiny_models):
    assert Path(tokenizer_folder(daemon)) == tiny_models["llama"]
    assert (tiny_models["llama"] / "tokenizer.json").is_file()


def test_openai_client_streams_one_text_chunk_per_token(daemon):
    client = openai.OpenAI(base_url=daemon.base_url + "/v1", api_key="unused", max_retries=0,
                           timeout=60)
    model = client.models.list().data[0].id
    stream = client.completions.create(model=model, prompt="Hello", max_tokens=MAX_TOKENS,
                                       stream=True, stream_options={"include_usage": True})
    texts, usage = [], None
    for chunk in stream:
        texts += [c.text for c in chunk.choices]
        usage = chunk.usage or usage
    assert len(texts) == MAX_TOKENS and all(texts), texts
    assert usage.completion_tokens == MAX_TOKENS
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=MAX_TOKENS,
        stream=True)
    deltas = [c.choices[0].delta.content for c in chat if c.choices and c.choices[0].delta.content]
    assert len(deltas) == MAX_TOKENS
    client.close()


def _guidellm() -> str:
    pytest.importorskip("guidellm", reason="guidellm is in the test extra: pip install -e '.[test]'")
    found = shutil.which("guidellm", path=str(Path(sys.executable).parent))
    assert found, "guidellm is importable but its command is not beside this python"
    return found


def test_guidellm_measures_ttft_and_itl_without_errors(daemon, tmp_path):
    out = tmp_path / "guidellm.json"
    cmd = [_guidellm(), "run",
           "--backend", f"kind=openai_http,target={daemon.base_url}",
           "--profile", "kind=concurrent,streams=4",
           "--constraint", "kind=max_requests,count=40",
           "--data", f"kind=synthetic_text,prompt_tokens=64,output_tokens={MAX_TOKENS}",
           "--tokenizer", f"kind=huggingface_auto,model={tokenizer_folder(daemon)}",
           "--output", f"kind=json,path={out}", "--disable-progress"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "COLUMNS": "200"}
    done = subprocess.run(cmd, check=False, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-6000:]
    metrics = json.loads(out.read_text())["benchmarks"][0]["metrics"]
    totals = metrics["request_totals"]
    ttft = metrics["time_to_first_token_ms"]["successful"]
    itl = metrics["inter_token_latency_ms"]["successful"]
    print(f"guidellm: {totals['successful']} requests, errored {totals['errored']}; "
          f"TTFT mean {ttft['mean']:.1f} ms p95 {ttft['percentiles']['p95']:.1f} ms; "
          f"ITL mean {itl['mean']:.2f} ms; output "
          f"{metrics['output_tokens_per_second']['successful']['mean']:.0f} tok/s")
    assert totals["errored"] == 0 and totals["incomplete"] == 0, totals
    assert totals["successful"] >= 36, totals  # the last few may be cut at the count
    assert ttft["mean"] > 0 and itl["mean"] > 0
    assert 5 < itl["mean"] < 200  # 10 ms a step: the gaps are real token gaps, not 0
    assert metrics["output_token_count"]["successful"]["mean"] >= MAX_TOKENS * 0.8

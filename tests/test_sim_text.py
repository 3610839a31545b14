"""The sim executor's text: tokens from the model's vocabulary that decode to visible text,
the same for a request's seed (or id) every run, never EOS, a special or a stop token.

Covers: engines/executors/sim_executor.py, engines/executors/sim_vocabulary.py.
"""
from __future__ import annotations

import pytest

from daemon.detokenizer import IncrementalDetokenizer
from engines.executors.build import build_executor
from engines.executors.executor_config import ExecutorConfig
from engines.executors.latency import zero_latency
from engines.executors.sim_executor import SimExecutor
from engines.executors.sim_vocabulary import text_token_ids
from engines.models.tiny_tokenizer import SPECIAL_TOKENS, write_tokenizer_files
from engines.models.tokenizer import Tokenizer
from engines.offline import Offline
from engines.scheduler import SchedulerConfig
from ipc.params import SamplingParams


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A folder with only the tiny model's tokenizer files (no weights, no torch)."""
    folder = tmp_path_factory.mktemp("tiny-tokenizer")
    write_tokenizer_files(folder, model_max_length=4096)
    return folder


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return Tokenizer(tokenizer_dir)


def _run(executor, requests, prompts=None):
    """{request id: output token ids} for (request id, SamplingParams) pairs; prompts by
    request id (default [5, 6, 7])."""
    prompts = prompts or {}
    offline = Offline(executor, SchedulerConfig())
    added = [offline.add_request(prompts.get(rid, [5, 6, 7]), params, request_id=rid)
             for rid, params in requests]
    while offline.core.has_work:
        offline.step()
    return {r.request_id: r.output_token_ids for r in added}


def test_text_tokens_decode_to_visible_text_and_leave_out_specials(tokenizer):
    ids = text_token_ids(tokenizer)
    specials = {tokenizer._tok.token_to_id(t) for t in SPECIAL_TOKENS}
    assert len(ids) > tokenizer.vocab_size // 2
    assert not set(ids) & (specials | tokenizer.eos_token_ids)
    for token in ids:
        text = tokenizer.decode([token])
        assert text and text.isprintable() and "\ufffd" not in text, (token, text)


def test_every_streamed_token_carries_text_and_no_stop_or_eos(tokenizer_dir, tokenizer):
    executor = build_executor(ExecutorConfig(kind="sim", model_dir=str(tokenizer_dir)))
    stops = list(executor.vocabulary[:100])  # the request forbids the first 100 text tokens
    out = _run(executor, [("cmpl-a", SamplingParams(max_tokens=64, stop_token_ids=stops))])
    tokens = out["cmpl-a"]
    assert len(tokens) == 64
    assert set(tokens) <= set(executor.vocabulary) - set(stops) - tokenizer.eos_token_ids
    detok = IncrementalDetokenizer(tokenizer)
    chunks = [detok.add(t) for t in tokens]
    assert all(chunks), chunks  # every token adds text, as a model's would
    assert len(set(tokens)) > 16  # varied text, not one token repeated


def test_same_seed_or_prompt_same_text_other_prompts_other_text(tokenizer):
    """As greedy decoding would: the prompt (or the seed) decides the text, not the id."""
    vocabulary = text_token_ids(tokenizer)
    prompts = {"a": [5, 6, 7], "b": [5, 6, 8], "a2": [5, 6, 7], "s1": [1], "s2": [2]}

    def run(requests):
        return _run(SimExecutor(zero_latency, vocabulary=vocabulary), requests, prompts)

    first = run([("a", SamplingParams(max_tokens=20)), ("b", SamplingParams(max_tokens=20)),
                 ("s1", SamplingParams(max_tokens=20, seed=7))])
    again = run([("b", SamplingParams(max_tokens=20)), ("a2", SamplingParams(max_tokens=20)),
                 ("s2", SamplingParams(max_tokens=20, seed=7))])
    assert first["a"] == again["a2"] and first["b"] == again["b"]
    assert first["a"] != first["b"]
    assert first["s1"] == again["s2"]  # the seed decides, not the prompt


def test_without_a_tokenizer_it_emits_token_zero():
    executor = build_executor(ExecutorConfig(kind="sim"))
    assert executor.vocabulary == (0,)
    out = _run(executor, [("x", SamplingParams(max_tokens=3, stop_token_ids=[0]))])
    assert out["x"] == [1, 1, 1]  # the next id past the stop token
    with pytest.raises(ValueError):
        SimExecutor(zero_latency, vocabulary=())

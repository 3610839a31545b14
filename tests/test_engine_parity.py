"""End to end on the tiny model: our instance core's greedy output is token-identical to
Hugging Face transformers' greedy `generate`, whatever the scheduling does to it --
several prompts of different lengths at once, prompts chunked across steps, and
KV blocks so few that requests are preempted and recomputed.

Covers: engines/offline.py, engines/instance_core.py, engines/executors/torch_executor.py, engines/models/llama.py.
"""
from __future__ import annotations

import pytest
import torch

from engines.executors.torch_executor import TorchExecutor
from engines.models.tokenizer import Tokenizer
from engines.offline import Offline
from engines.scheduler import SchedulerConfig
from ipc.messages import StepOutputs
from ipc.params import SamplingParams

pytestmark = pytest.mark.slow  # token-for-token against transformers

TEXTS = [
    "Hi",
    "The scheduler reorders waiting prefills by deadline.",
    "Paged attention keeps the KV cache in fixed-size blocks, so memory is never fragmented "
    "and requests of any length share one pool.",
    "naïve café — 東京",
    "Sarathi-Serve splits long prompts into chunks so decodes are never stalled; "
    "Ascendra adds low- and high-priority instances on top, and moves only prompt tokens "
    "between them, never KV cache. This sentence is here to make the prompt longer.",
]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def model_dir(tiny_models):
    return tiny_models["llama"]


@pytest.fixture(scope="module")
def prompts(model_dir) -> list[list[int]]:
    ids = [Tokenizer(model_dir).encode(t) for t in TEXTS]
    assert len(set(map(len, ids))) == len(ids), "prompts of different lengths"
    return ids


@pytest.fixture(scope="module")
def hf_outputs(model_dir, prompts) -> list[list[int]]:
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=MAX_TOKENS)
            outs.append(out[0, len(p):].tolist())
    return outs


def run_engine(model_dir, prompts, mode, chunk_size, num_kv_blocks=None):
    executor = TorchExecutor(model_dir, block_size=16, num_kv_blocks=num_kv_blocks, device="cpu")
    offline = Offline(executor, SchedulerConfig(mode=mode, chunk_size=chunk_size))
    results = offline.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))
    assert offline.core.kv.num_free_blocks == offline.core.kv.num_blocks, "KV blocks leaked"
    return offline, results


@pytest.mark.parametrize("mode", ["sarathi", "vllm", "lp", "hp"])
def test_greedy_matches_transformers_with_chunked_prefills(model_dir, prompts, hf_outputs, mode):
    offline, results = run_engine(model_dir, prompts, mode, chunk_size=16)
    assert [r.token_ids for r in results] == hf_outputs
    assert offline.core.scheduler.num_preemptions == 0


@pytest.mark.parametrize("mode", ["sarathi", "vllm", "lp", "hp"])
def test_greedy_matches_transformers_through_preemption(model_dir, prompts, hf_outputs, mode):
    longest = max(len(p) for p in prompts) + MAX_TOKENS
    few_blocks = -(-longest // 16) + 2  # the longest request fits, all of them together do not
    offline, results = run_engine(model_dir, prompts, mode, chunk_size=16, num_kv_blocks=few_blocks)
    assert offline.core.scheduler.num_preemptions > 0, "the test must exercise preemption"
    assert [r.token_ids for r in results] == hf_outputs


def test_finish_reasons_follow_eos_and_max_tokens(model_dir, prompts, hf_outputs):
    eos = TorchExecutor(model_dir, device="cpu").eos_token_ids
    _, results = run_engine(model_dir, prompts, "sarathi", chunk_size=64)
    for result, expected in zip(results, hf_outputs):
        stopped = expected[-1] in eos
        assert result.finish_reason == ("stop" if stopped else "length")
        assert len(result.token_ids) == len(expected) <= MAX_TOKENS


@pytest.mark.parametrize("mode", ["lp", "hp"])
def test_reordering_by_deadline_does_not_change_tokens(model_dir, prompts, hf_outputs, mode):
    """Later arrivals get earlier deadlines, so EDF runs them first; tokens stay the same."""
    executor = TorchExecutor(model_dir, block_size=16, device="cpu")
    offline = Offline(executor, SchedulerConfig(mode=mode, chunk_size=16, max_num_seqs=2,
                                                value_function="edf"))
    now = offline.clock()
    requests = [offline.add_request(p, SamplingParams(max_tokens=MAX_TOKENS),
                                   deadline=now + 100.0 - i) for i, p in enumerate(prompts)]
    first_tokens = []
    while offline.core.has_work:
        for message in offline.step():
            if isinstance(message, StepOutputs):
                first_tokens += [r for r in message.tokens.request_ids if r not in first_tokens]
    assert first_tokens[0] == requests[-1].request_id, "the most urgent request started first"
    assert [r.output_token_ids for r in requests] == hf_outputs

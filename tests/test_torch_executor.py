"""TorchExecutor against Hugging Face transformers, on mixed chunked batches over a paged cache.

The batches are built by hand (no scheduler): requests join one per step, prompts are fed
in chunks of 7 tokens, so prefill chunks that continue cached context run in the same
forward pass as other requests' decodes. Block ids are handed out shuffled, so a request's
cache is really scattered over the pool.

Covers: engines/executors/torch_executor.py.
"""
from __future__ import annotations

import random

import pytest
import torch

from engines.batch import Batch
from engines.executors.torch_executor import TorchExecutor
from engines.models.tiny import ARCHS
from engines.models.tokenizer import Tokenizer
from engines.request import Request
from ipc.params import SamplingParams

transformers = pytest.importorskip("transformers")

BLOCK_SIZE = 4
NUM_BLOCKS = 512
GREEDY = SamplingParams(max_tokens=20)


@pytest.fixture(scope="module")
def executors(tiny_models):
    return {arch: TorchExecutor(tiny_models[arch], block_size=BLOCK_SIZE, num_kv_blocks=NUM_BLOCKS,
                                device="cpu")
            for arch in ARCHS}


@pytest.fixture(scope="module")
def hf_models(tiny_models):
    return {arch: transformers.AutoModelForCausalLM.from_pretrained(
        tiny_models[arch], dtype=torch.float32).eval() for arch in ARCHS}


def make_prompts(tiny_models, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(5, 1024) for _ in range(n)] for n in (1, 6, 13, 29, 41)]
    prompts.append(Tokenizer(tiny_models["llama"]).encode("The library was quiet except for"))
    return prompts


class BlockPool:
    """A trivial allocator: shuffled free block ids, handed out as requests grow."""

    def __init__(self, seed: int = 0) -> None:
        self.free = list(range(NUM_BLOCKS))
        random.Random(seed).shuffle(self.free)

    def grow(self, request: Request, num_tokens: int) -> None:
        while len(request.block_table) * BLOCK_SIZE < num_tokens:
            request.block_table.append(self.free.pop())


def run(executor, prompts, params, *, chunk: int = 7, step=None) -> list[list[int]]:
    """Generate for every prompt; one request joins per step, prompts go in `chunk` pieces.
    Stops a request at EOS or max_tokens. `step(batch) -> tokens` replaces execute."""
    step = step or executor.execute
    params = params if isinstance(params, list) else [params] * len(prompts)
    requests = [Request(f"r{i}", p, s) for i, (p, s) in enumerate(zip(prompts, params))]
    pending, active, pool = list(requests), [], BlockPool()
    while pending or active:
        if pending:
            active.append(pending.pop(0))
        batch = Batch()
        for request in active:
            n = min(chunk, request.num_uncomputed_tokens)
            pool.grow(request, request.num_computed_tokens + n)
            batch.add(request, n)
        sampled = iter(step(batch))
        for c in batch.chunks:
            c.request.num_computed_tokens += c.num_tokens
            if c.samples:
                token = next(sampled)
                c.request.token_ids.append(token)
                if (token in executor.eos_token_ids
                        or c.request.num_output_tokens >= c.request.sampling.max_tokens):
                    active.remove(c.request)
    return [r.output_token_ids for r in requests]


def hf_greedy(model, prompt: list[int], max_new: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False,
                         pad_token_id=model.generation_config.eos_token_id)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.slow
def test_greedy_matches_hugging_face(arch, executors, hf_models, tiny_models):
    prompts = make_prompts(tiny_models)
    ours = run(executors[arch], prompts, GREEDY)
    for prompt, tokens in zip(prompts, ours):
        assert tokens == hf_greedy(hf_models[arch], prompt, GREEDY.max_tokens)
    assert sum(map(len, ours)) > 3 * len(prompts)  # mostly real generations, not instant EOS


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.slow
def test_logits_match_hugging_face_at_every_sampling_step(arch, executors, hf_models,
                                                          tiny_models):
    executor, model = executors[arch], hf_models[arch]
    worst = 0.0

    def checked_step(batch):
        logits, requests = executor.compute_logits(batch)
        nonlocal worst
        for row, request in zip(logits, requests):
            with torch.no_grad():
                ref = model(torch.tensor([request.token_ids])).logits[0, -1]
            worst = max(worst, (row - ref).abs().max().item())
        return logits.argmax(dim=-1).tolist()

    run(executor, make_prompts(tiny_models, seed=1)[:4], SamplingParams(max_tokens=8),
        chunk=5, step=checked_step)
    assert worst < 1e-3


def test_seeded_request_ignores_its_batch_companions(executors, tiny_models):
    executor = executors["llama"]
    prompts = make_prompts(tiny_models, seed=2)
    seeded = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, top_k=100, seed=1234)
    alone = run(executor, [prompts[3]], seeded)[0]
    companions = [SamplingParams(max_tokens=16), SamplingParams(max_tokens=12, temperature=1.0),
                  seeded, SamplingParams(max_tokens=16, temperature=0.7, seed=7)]
    crowded = run(executor, [prompts[0], prompts[5], prompts[3], prompts[4]], companions)
    assert crowded[2] == alone
    reseeded = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, top_k=100, seed=99)
    assert run(executor, [prompts[3]], reseeded)[0] != alone


def test_top_k_one_is_greedy(executors, tiny_models):
    executor = executors["mistral"]
    prompts = make_prompts(tiny_models, seed=3)
    top1 = SamplingParams(max_tokens=12, temperature=1.5, top_k=1)
    assert run(executor, prompts, top1) == run(executor, prompts, SamplingParams(max_tokens=12))


def test_unseeded_sampling_returns_valid_tokens(executors, tiny_models):
    executor = executors["qwen2"]
    hot = SamplingParams(max_tokens=10, temperature=1.3, top_p=0.9)
    outputs = run(executor, make_prompts(tiny_models, seed=4), hot)
    vocab = executor.config.vocab_size
    assert all(0 <= t < vocab for out in outputs for t in out)
    assert all(1 <= len(out) <= 10 for out in outputs)


def test_executor_properties_and_errors(executors, tiny_models):
    executor = executors["llama"]
    assert executor.block_size == BLOCK_SIZE and executor.num_kv_blocks == NUM_BLOCKS
    assert executor.max_model_len == 2048
    assert executor.eos_token_ids == frozenset({Tokenizer(tiny_models["llama"]).eos_token_ids.pop()})
    assert executor.execute(Batch()) == []
    short = Request("short", list(range(5, 15)), GREEDY)
    short.block_table = [0]  # 10 tokens need 3 blocks of 4
    batch = Batch()
    batch.add(short, 10)
    with pytest.raises(ValueError, match="KV blocks"):
        executor.execute(batch)


def test_cpu_kv_cache_is_sized_from_the_budget(tiny_models):
    executor = TorchExecutor(tiny_models["llama"], block_size=16, cpu_kv_cache_bytes=2**20,
                             device="cpu")
    assert executor.num_kv_blocks == 2**20 // executor.kv_block_bytes
    assert executor.kv_caches[0][0].shape == (executor.num_kv_blocks, 16, 2, 32)


# ---- log-probabilities, penalties and logit bias against transformers -------------------

def hf_next_logits(model, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0, -1].float()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.slow
def test_logprobs_are_the_model_log_softmax(arch, executors, hf_models, tiny_models):
    """Every reported logprob (the sampled token's and the top k) is log_softmax of the
    reference model's logits at that position, whatever the temperature."""
    executor, model = executors[arch], hf_models[arch]
    params = [SamplingParams(max_tokens=6, logprobs=5), SamplingParams(max_tokens=6),
              SamplingParams(max_tokens=6, temperature=0.8, seed=5, logprobs=3),
              SamplingParams(max_tokens=6, logprobs=0)]
    checked = []

    def step(batch):
        tokens = executor.execute(batch)
        for chunk, token in zip([c for c in batch.chunks if c.samples], tokens):
            request, got = chunk.request, chunk.request.sampled_logprobs
            if request.sampling.logprobs is None:
                assert got is None
                continue
            reference = hf_next_logits(model, request.token_ids).log_softmax(-1)
            top = reference.topk(request.sampling.logprobs)
            assert got.logprob == pytest.approx(reference[token].item(), abs=1e-4)
            assert got.top_token_ids == top.indices.tolist()
            assert got.top_logprobs == pytest.approx(top.values.tolist(), abs=1e-4)
            checked.append(request.request_id)
        return tokens

    run(executor, make_prompts(tiny_models, seed=5)[:4], params, chunk=5, step=step)
    assert len(checked) == 3 * 6


def hf_adjusted_greedy(model, prompt: list[int], max_new: int, sampling: SamplingParams) -> list[int]:
    """Greedy under OpenAI's penalties and logit bias, computed on the reference model."""
    tokens = list(prompt)
    for _ in range(max_new):
        logits = hf_next_logits(model, tokens)
        counts = torch.bincount(torch.tensor(tokens[len(prompt):], dtype=torch.long),
                                minlength=logits.shape[-1]).float()
        logits -= sampling.frequency_penalty * counts + sampling.presence_penalty * (counts > 0)
        for token, bias in sampling.logit_bias.items():
            logits[token] += bias
        tokens.append(int(logits.argmax()))
    return tokens[len(prompt):]


@pytest.mark.slow
def test_penalties_and_logit_bias_match_a_reference(executors, hf_models, tiny_models):
    executor, model = executors["llama"], hf_models["llama"]
    prompts = [make_prompts(tiny_models, seed=6)[i] for i in (1, 5)]  # greedy repeats itself
    plain = run(executor, prompts, SamplingParams(max_tokens=16))
    for sampling in (SamplingParams(max_tokens=16, frequency_penalty=2.0),
                     SamplingParams(max_tokens=16, presence_penalty=-2.0),
                     SamplingParams(max_tokens=16, presence_penalty=1.5, frequency_penalty=-0.5),
                     SamplingParams(max_tokens=16, logit_bias={plain[0][0]: -100.0, 7: 3.0})):
        ours = run(executor, prompts, sampling)
        for prompt, tokens in zip(prompts, ours):
            assert tokens == hf_adjusted_greedy(model, prompt, len(tokens), sampling)
        assert ours != plain

"""The torch executor on CUDA (bf16): skipped where there is no GPU.

Decode steps replayed from CUDA graphs must give what the same steps give eagerly, and
the bf16 GPU model what the fp32 CPU model gives, within bf16's rounding.

Covers: engines/executors/torch_executor.py, engines/executors/decode_graphs.py.
"""
from __future__ import annotations

import random

import pytest
import torch

from engines.batch import Batch
from engines.executors.torch_executor import TorchExecutor
from engines.request import Request
from ipc.params import SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

GREEDY = SamplingParams(max_tokens=8)


@pytest.fixture(scope="module")
def cuda_executor(tiny_models):
    return TorchExecutor(tiny_models["llama"], block_size=16, num_kv_blocks=256,
                         device="cuda", cuda_graph_max_batch=32)


def prefilled(executor, num_requests: int, seed: int = 0) -> list[Request]:
    """Requests whose prompts (20..200 tokens) are in `executor`'s cache, each with a next
    token appended: ready to decode. The token is drawn from the seed, not sampled, so two
    executors decode the same tokens: a near-tie that bf16 rounding flips at the prefill
    would otherwise give one request a different token and a wholly different row."""
    rng = random.Random(seed)
    blocks = list(range(executor.num_kv_blocks))
    rng.shuffle(blocks)
    requests = []
    for i in range(num_requests):
        prompt = [rng.randrange(5, 1000) for _ in range(rng.randrange(20, 200))]
        request = Request(f"r{i}", prompt, GREEDY)
        request.block_table = [blocks.pop() for _ in range(-(-(len(prompt) + 8) // 16))]
        batch = Batch()
        batch.add(request, len(prompt))
        executor.execute(batch)
        request.token_ids.append(rng.randrange(5, 1000))
        request.num_computed_tokens = len(prompt)
        requests.append(request)
    return requests


def decode_batch(requests) -> Batch:
    batch = Batch()
    batch.add_decodes(requests)
    return batch


def test_graph_replay_gives_the_eager_logits(cuda_executor):
    assert cuda_executor.graphs is not None and cuda_executor.attention.name == "triton-paged"
    requests = prefilled(cuda_executor, 11)  # padded to the graph of 16
    replayed, _ = cuda_executor.compute_logits(decode_batch(requests))
    replayed = replayed.clone()
    graphs, cuda_executor.graphs = cuda_executor.graphs, None
    try:
        eager, _ = cuda_executor.compute_logits(decode_batch(requests))
    finally:
        cuda_executor.graphs = graphs
    assert torch.allclose(replayed.float(), eager.float(), atol=2e-2, rtol=2e-2)
    assert torch.equal(replayed.argmax(-1), eager.argmax(-1))


def test_bf16_on_the_gpu_follows_fp32_on_the_cpu(cuda_executor, tiny_models):
    cpu = TorchExecutor(tiny_models["llama"], block_size=16, num_kv_blocks=256, device="cpu")
    logits = {}
    for name, executor in (("cuda", cuda_executor), ("cpu", cpu)):
        requests = prefilled(executor, 6, seed=1)
        logits[name], _ = executor.compute_logits(decode_batch(requests))
    got, expected = logits["cuda"].float().cpu(), logits["cpu"]
    # bf16 keeps 8 bits of mantissa: 0.4 % per rounding, about 3 % over the tiny model's
    # four layers (3.1 % measured on an H200); a wrong kernel is off by 100 %
    assert float((got - expected).norm() / expected.norm()) < 6e-2
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() >= 5 / 6


@pytest.mark.parametrize("fused", [("add_rms_norm",), ("rotation", "rotate_qk"),
                                   ("silu_and_mul",)])
def test_each_fused_kernel_alone_keeps_the_torch_ops_logits(tiny_models, fused):
    """The model with one fused Triton step and torch ops for the rest, against torch ops
    throughout, both bf16 on this GPU (eager): a wrong kernel shows which one it is."""
    from engines.models.elementwise import TorchOps
    from engines.models.triton_elementwise import TritonOps
    hybrid = type("Hybrid", (TorchOps,), {name: getattr(TritonOps, name) for name in fused})
    executor = TorchExecutor(tiny_models["llama"], block_size=16, num_kv_blocks=256,
                             device="cuda", cuda_graph_max_batch=0)
    logits = {}
    for ops in (TorchOps, hybrid):
        executor.model.set_ops(ops)
        requests = prefilled(executor, 6, seed=2)
        logits[ops], _ = executor.compute_logits(decode_batch(requests))
    got, expected = logits[hybrid].float(), logits[TorchOps].float()
    assert float((got - expected).norm() / expected.norm()) < 3e-2

"""The sampler on hand-made logits: greedy, the sampled distribution, top-k / top-p cuts, seeds."""
from __future__ import annotations

import torch

from engines.executors.sampler import Sampler
from engines.request import Request
from ipc.params import SamplingParams

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])


def requests(n: int, **params) -> list[Request]:
    return [Request(f"r{i}", [1], SamplingParams(**params)) for i in range(n)]


def frequencies(tokens: list[int]) -> torch.Tensor:
    return torch.bincount(torch.tensor(tokens), minlength=len(PROBS)).float() / len(tokens)


def test_greedy_is_argmax_per_row():
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 0.0, 1.0]])
    assert Sampler()(logits, requests(2)) == [1, 0]


def test_mixed_batch_keeps_greedy_rows_greedy():
    logits = PROBS.log().repeat(200, 1)
    batch = requests(100) + requests(100, temperature=1.0)
    tokens = Sampler()(logits, batch)
    assert tokens[:100] == [0] * 100
    assert len(set(tokens[100:])) > 1


def test_sampled_frequencies_follow_the_distribution():
    torch.manual_seed(0)
    tokens = Sampler()(PROBS.log().repeat(8000, 1), requests(8000, temperature=1.0))
    assert torch.allclose(frequencies(tokens), PROBS, atol=0.02)


def test_top_k_and_top_p_cut_the_tail():
    torch.manual_seed(1)
    logits = PROBS.log().repeat(4000, 1)
    top_k = Sampler()(logits, requests(4000, temperature=1.0, top_k=2))
    assert set(top_k) == {0, 1}
    assert abs(frequencies(top_k)[0].item() - 0.5 / 0.8) < 0.03
    top_p = Sampler()(logits, requests(4000, temperature=1.0, top_p=0.7))
    assert set(top_p) == {0, 1}  # 0.5 is under 0.7, so token 1 is still needed
    assert Sampler()(logits[:10], requests(10, temperature=1.0, top_p=0.01)) == [0] * 10


def test_seeded_rows_do_not_depend_on_the_batch():
    logits = torch.randn(1, 50)
    solo = Request("s", [1], SamplingParams(temperature=1.0, seed=42))
    crowd_member = Request("c", [1], SamplingParams(temperature=1.0, seed=42))
    others = requests(5, temperature=1.0)
    sampler = Sampler()
    for _ in range(10):
        alone = sampler(logits, [solo])[0]
        crowded = sampler(torch.cat([logits.repeat(3, 1), logits, logits]),
                          others[:3] + [crowd_member] + others[3:4])[3]
        assert alone == crowded

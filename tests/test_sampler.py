"""The sampler on hand-made logits: greedy, the sampled distribution, top-k / top-p cuts, seeds,
penalties, logit bias and log-probabilities.

Covers: engines/executors/sampler.py, engines/executors/logit_adjust.py.
"""
from __future__ import annotations

import pytest
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


# ---- penalties, logit bias, log-probabilities -------------------------------------------

def test_penalties_follow_openai_formula_over_generated_tokens_only():
    from engines.executors.logit_adjust import adjust_logits
    request = Request("p", [2, 2, 3], SamplingParams(frequency_penalty=0.5, presence_penalty=0.25))
    request.token_ids += [0, 0, 1]  # generated: token 0 twice, token 1 once
    plain = Request("q", [1], SamplingParams())
    logits = torch.ones(2, 4)
    adjusted = adjust_logits(logits, [request, plain])
    # mu[j] - c[j] * frequency - (c[j] > 0) * presence; the prompt's 2s and 3 do not count
    assert adjusted[0].tolist() == [1 - 2 * 0.5 - 0.25, 1 - 0.5 - 0.25, 1.0, 1.0]
    assert adjusted[1].tolist() == [1.0] * 4  # a request without penalties is untouched
    assert logits.tolist() == [[1.0] * 4] * 2  # and the model's logits are not changed in place


def test_penalties_still_count_the_output_of_a_request_resumed_after_a_crash():
    """Resumed by recompute, its output so far is part of its new prompt: still counted."""
    from engines.executors.logit_adjust import adjust_logits
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    uninterrupted = Request("p", [2, 2, 3], params)
    uninterrupted.token_ids += [0, 0, 1]
    resumed = Request("p", [2, 2, 3, 0, 0], params, generated_before=2)
    resumed.token_ids += [1]
    logits = torch.ones(2, 4)
    adjusted = adjust_logits(logits, [uninterrupted, resumed])
    assert adjusted[0].tolist() == adjusted[1].tolist()


def test_negative_penalties_encourage_repetition():
    request = Request("p", [3], SamplingParams(presence_penalty=-2.0))
    request.token_ids.append(1)
    assert Sampler()(torch.tensor([[1.0, 0.0, 0.5, 0.0]]), [request]) == [1]


def test_logit_bias_moves_greedy_and_sampled_choices():
    logits = torch.tensor([[5.0, 0.0, 1.0]])
    assert Sampler()(logits, [Request("b", [1], SamplingParams(logit_bias={0: -100.0}))]) == [2]
    assert Sampler()(logits, [Request("c", [1], SamplingParams(logit_bias={1: 100.0}))]) == [1]
    banned = {0: -100.0, 2: -100.0}
    assert Sampler()(logits.repeat(50, 1), requests(50, temperature=1.0, logit_bias=banned)) == [1] * 50


def test_logprobs_are_the_raw_log_softmax_with_top_alternatives():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0], [0.0, 3.0, 0.0, 1.0]])
    asked = Request("a", [1], SamplingParams(logprobs=2, temperature=0.7, seed=3,
                                             logit_bias={0: -100.0}, presence_penalty=1.0))
    silent = Request("s", [1], SamplingParams())
    tokens = Sampler()(logits, [asked, silent])
    reference = logits[0].log_softmax(-1)  # before bias, penalties and temperature (vLLM's default)
    got = asked.sampled_logprobs
    assert tokens[0] != 0  # the bias kept token 0 out of the sample ...
    assert got.logprob == pytest.approx(reference[tokens[0]].item())  # ... not out of the report
    assert got.top_token_ids == [0, 1]
    assert got.top_logprobs == pytest.approx(reference[:2].tolist())
    assert silent.sampled_logprobs is None


def test_logprobs_zero_reports_only_the_chosen_token():
    request = Request("z", [1], SamplingParams(logprobs=0))
    assert Sampler()(torch.tensor([[0.0, 1.0]]), [request]) == [1]
    got = request.sampled_logprobs
    assert got.top_token_ids == [] and got.top_logprobs == []
    assert got.logprob == pytest.approx(torch.tensor([0.0, 1.0]).log_softmax(-1)[1].item())

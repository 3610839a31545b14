"""The elastic batch's KV reserve over columns equals the per-request reference, to the bit.

`DecodeLengthHistory.expected_remaining_array` and `decode_reserve_columns` are what the
scheduler runs; `expected_remaining` and `decode_reserve` are the plain reference.
Hypothesis draws histories with repeated lengths (ties at the bisection), windows that
forget, and running decodes on the edges (generated equal to an observed length, at
max_tokens, blocks held past what is needed).

Covers: policies/admission.py, policies/output_reserve.py.
"""
from __future__ import annotations

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from policies.admission import (  # noqa: E402
    DecodeLengthHistory, decode_reserve, decode_reserve_columns,
)
from tests.examples import examples  # noqa: E402
from tests.policy_fakes import FakeRequest  # noqa: E402

SETTINGS = dict(max_examples=examples(200), deadline=None, database=None, derandomize=True)

lengths = st.one_of(st.sampled_from([1, 2, 7, 16, 100, 101]), st.integers(1, 5000))
histories = st.tuples(st.integers(1, 40), st.lists(lengths, max_size=120))
decodes = st.lists(st.tuples(st.integers(1, 3000),                      # prompt
                             st.one_of(st.sampled_from([0, 1, 7, 100]), lengths),  # generated
                             st.one_of(st.sampled_from([1, 100, 101]), st.integers(1, 8000)),
                             st.integers(0, 6)),                        # extra blocks held
                   max_size=40)


def history_of(window_and_lengths) -> DecodeLengthHistory:
    window, observed = window_and_lengths
    history = DecodeLengthHistory(window=window)
    for length in observed:
        history.observe(length)
    return history


def running_decodes(drawn, block_size):
    requests = []
    for i, (prompt, generated, max_tokens, extra) in enumerate(drawn):
        request = FakeRequest(f"r{i}", prompt, num_output_tokens=generated, max_tokens=max_tokens)
        request.num_computed_tokens = request.num_tokens - 1
        request.block_table = list(range(-(-request.num_computed_tokens // block_size) + extra))
        requests.append(request)
    return requests


@settings(**SETTINGS)
@given(histories, decodes)
def test_expected_remaining_array_is_expected_remaining(window_and_lengths, drawn):
    history = history_of(window_and_lengths)
    generated = np.array([g for _, g, _, _ in drawn], dtype=np.int64)
    max_tokens = np.array([m for _, _, m, _ in drawn], dtype=np.int64)
    got = history.expected_remaining_array(generated, max_tokens).tolist()
    want = [history.expected_remaining(g, m) for _, g, m, _ in drawn]
    assert got == want  # floats compared exactly


@settings(**SETTINGS)
@given(histories, decodes, st.sampled_from([1, 16, 32]))
def test_decode_reserve_columns_is_decode_reserve(window_and_lengths, drawn, block_size):
    history = history_of(window_and_lengths)
    running = running_decodes(drawn, block_size)
    columns = [np.array(c, dtype=np.int64).reshape(-1) for c in (
        [r.num_tokens for r in running], [r.num_output_tokens for r in running],
        [r.sampling.max_tokens for r in running], [len(r.block_table) for r in running])]
    assert decode_reserve_columns(*columns, history, block_size) == decode_reserve(
        running, history, block_size)


def test_columns_give_way_past_float64_integers():
    history = DecodeLengthHistory()
    huge = np.array([2**60], dtype=np.int64)
    assert decode_reserve_columns(huge, huge, huge, huge, history, 16) is None

"""Elastic sequence parallelism in the model (engines/models/sequence_parallel.py,
engines/models/esp_sequence.py): a long prompt prefilled striped over 2 and 3 ranks, each
keeping only its own tokens' KV, then decoded on one rank with the other ranks' KV merged
by log-sum-exp, gives one instance's logits within fp32 tolerance and its greedy tokens.

Covers: engines/models/sequence_parallel.py, engines/models/esp_sequence.py, engines/models/stripes.py.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from engines.models.sequence_parallel import merge_partials, partial_attention
from engines.models.stripes import stripe
from tests import esp_ranks

PROMPT_TOKENS = 1600   # near the tiny model's 2,048-token context
MAX_TOKENS = 12


def test_stripes_cover_every_position_once_and_differ_by_at_most_one():
    for n in (7, 1600, 1601):
        for size in (1, 2, 3):
            parts = [list(stripe(n, size, r)) for r in range(size)]
            assert sorted(p for part in parts for p in part) == list(range(n))
            assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_partial_attentions_merged_by_log_sum_exp_equal_attention_over_all_keys():
    torch.manual_seed(0)
    heads, kv_heads, dim, n = 8, 2, 32, 50
    q = torch.randn(heads, dim)
    keys, values = torch.randn(n, kv_heads, dim), torch.randn(n, kv_heads, dim)
    expected = F.scaled_dot_product_attention(q[None, :, None], keys.transpose(0, 1)[None],
                                              values.transpose(0, 1)[None], enable_gqa=True)
    cuts = [(0, 17), (17, 17), (17, 50)]  # the middle holder holds nothing
    parts = torch.stack([partial_attention(q, keys[a:b], values[a:b]) for a, b in cuts])
    assert math.isinf(parts[1, 0, -1]) and parts[1, 0, -1] < 0
    torch.testing.assert_close(merge_partials(parts), expected[0, :, 0], rtol=1e-5, atol=1e-6)


# -- k processes over gloo ---------------------------------------------------------------

@pytest.fixture(scope="module")
def prompt(tiny_models) -> list[int]:
    from engines.models.tokenizer import Tokenizer
    from tests.test_engine_parity import TEXTS
    ids: list[int] = []
    tokenizer = Tokenizer(tiny_models["llama"])
    while len(ids) < PROMPT_TOKENS:
        ids += tokenizer.encode(" ".join(TEXTS))
    return ids[:PROMPT_TOKENS]


@pytest.fixture(scope="module")
def one_instance(tiny_models, prompt):
    """One ordinary instance: its greedy tokens (the instance core, Offline) and the logits
    of the prompt and of each decoded token (its model over the paged cache)."""
    from engines.executors.torch_executor import TorchExecutor
    from engines.models.attention import SeqSpec
    from engines.offline import Offline
    from engines.scheduler import SchedulerConfig
    from ipc.params import SamplingParams
    executor = TorchExecutor(tiny_models["llama"], device="cpu", num_kv_blocks=160)
    engine = Offline(executor, SchedulerConfig(mode="sarathi", chunk_size=512))
    [result] = engine.generate([prompt], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    tokens = list(result.token_ids)
    sequence = prompt + tokens[:-1]
    n = len(sequence)
    meta = executor.attention.build([SeqSpec(0, n, list(range(-(-n // 16))))])
    rows = torch.arange(len(prompt) - 1, n)
    with torch.inference_mode():
        logits = executor.model(torch.tensor(sequence), torch.arange(n), executor.kv_caches,
                                meta, rows)
    return tokens, logits


def _run_group(tmp_path, model_dir, prompt, size, master, rank_main=esp_ranks.run_rank,
               *extra):
    import torch.multiprocessing as mp
    from safetensors.torch import load_file
    out = tmp_path / "master.safetensors"
    mp.spawn(rank_main, nprocs=size, join=True,
             args=(size, str(tmp_path / "group-store"), str(model_dir), prompt, MAX_TOKENS,
                   master, str(out), *extra))
    return load_file(str(out))


@pytest.mark.slow  # two or three rank processes
@pytest.mark.parametrize("size,master", [(2, 0), (3, 2)])
def test_esp_prefill_and_scaled_down_decode_equal_one_instance(tmp_path, tiny_models, prompt,
                                                              one_instance, size, master):
    # the master is never the rank that computed the prompt's last token: the first token
    # crosses ranks too
    assert (len(prompt) - 1) % size != master
    tokens, logits = one_instance
    result = _run_group(tmp_path, tiny_models["llama"], prompt, size, master)
    torch.testing.assert_close(result["logits"], logits, rtol=1e-4, atol=1e-4)
    assert result["tokens"].tolist() == tokens
    # the master holds its stripe of the prompt and the decoded tokens, nothing more
    assert int(result["held"]) == len(stripe(len(prompt), size, master)) + MAX_TOKENS - 1


@pytest.mark.slow  # three rank processes
def test_scaling_down_by_moving_the_kv_to_the_master_decodes_as_one_instance(
        tmp_path, tiny_models, prompt, one_instance):
    """The other scale-down: each stripe gathered to the master once, which then decodes
    with its ordinary paged attention."""
    tokens, logits = one_instance
    result = _run_group(tmp_path, tiny_models["llama"], prompt, 3, 1,
                        rank_main=esp_ranks.run_rank_gathered)
    torch.testing.assert_close(result["logits"], logits, rtol=1e-4, atol=1e-4)
    assert result["tokens"].tolist() == tokens


@pytest.mark.slow  # three rank processes
def test_a_prefill_in_chunks_then_moved_to_the_master_decodes_as_one_instance(
        tmp_path, tiny_models, prompt, one_instance):
    """The group's prefill in three chunks (each all-gathers the earlier chunks' stripes
    from the ranks' caches), as the instance core cuts it: the same logits and tokens."""
    tokens, logits = one_instance
    result = _run_group(tmp_path, tiny_models["llama"], prompt, 3, 1,
                        esp_ranks.run_rank_gathered, 512)
    torch.testing.assert_close(result["logits"], logits, rtol=1e-4, atol=1e-4)
    assert result["tokens"].tolist() == tokens

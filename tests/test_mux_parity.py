"""A multiplexed instance (MuxServe): three tiny models -- two of the same shape and
different seeds, one of another shape (3 layers, 4 KV heads) -- in one instance, one KV
pool shared by all, give each request the same greedy tokens as the model's dedicated
instance: through chunked prefills split by the step's shares, through preemption when
the shared pool runs short, and with prefix caching per model.

Covers: engines/mux_core.py, engines/mux_build.py, engines/kv_pool.py, engines/executors/mux_executor.py, policies/mux_share.py, engines/offline.py.
"""
from __future__ import annotations

import pytest

from engines.executors.mux_executor import MuxExecutor
from engines.executors.torch_executor import TorchExecutor
from engines.models.model_config import ModelConfig
from engines.models.tiny import make_tiny_model
from engines.mux_build import build_mux_core, units_per_block
from engines.offline import Offline
from engines.perf.model_shape import ModelShape
from engines.scheduler import SchedulerConfig
from ipc.messages import Role, StepOutputs
from ipc.params import SamplingParams

pytestmark = pytest.mark.slow  # three torch models, token for token

MAX_TOKENS = 12
BLOCK = 16
#: (served name, seed, shape)
MODELS = (("a", 0, "tiny"), ("b", 1, "tiny"), ("c", 2, "tiny-3x4"))


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mux-models")
    return {name: make_tiny_model(root / name, seed=seed, shape=shape)
            for name, seed, shape in MODELS}


@pytest.fixture(scope="module")
def shapes(model_dirs):
    return {name: ModelShape.from_config(ModelConfig.from_pretrained(d))
            for name, d in model_dirs.items()}


def _prompts(i: int) -> list[list[int]]:
    """Model i's prompts: different lengths, the last two sharing a 40-token prefix."""
    shared = [7 + (k * 13 + i) % 200 for k in range(40)]
    return [[5 + (k * 7 + i) % 250 for k in range(9 + 5 * i)],
            [11 + (k * 3 + i) % 240 for k in range(37)],
            shared + [3, 4, 5],
            shared + [9, 8]]


@pytest.fixture(scope="module")
def dedicated(model_dirs):
    """Each model's greedy tokens on its own instance, plenty of KV, whole prompts."""
    out = {}
    for i, (name, _, _) in enumerate(MODELS):
        executor = TorchExecutor(model_dirs[name], block_size=BLOCK, num_kv_blocks=64,
                                 device="cpu")
        offline = Offline(executor, SchedulerConfig(mode="sarathi", chunk_size=512))
        out[name] = [r.token_ids for r in offline.generate(
            _prompts(i), SamplingParams(max_tokens=MAX_TOKENS))]
    return out


def _mux(model_dirs, shapes, num_units: int, **config) -> Offline:
    costs = units_per_block(shapes)
    executors = {name: TorchExecutor(model_dirs[name], block_size=BLOCK,
                                     num_kv_blocks=num_units // costs[name], device="cpu")
                 for name, _, _ in MODELS}
    scheduler = SchedulerConfig(mode="sarathi", **config)
    core = build_mux_core(0, Role.PEER, executors, shapes, scheduler, num_units)
    return Offline(MuxExecutor(executors), scheduler, core=core)


def _run(offline: Offline) -> dict[str, list[list[int]]]:
    """Every model's prompts submitted interleaved, run to the end; tokens by model."""
    requests = {name: [] for name, _, _ in MODELS}
    for k in range(4):
        for i, (name, _, _) in enumerate(MODELS):
            requests[name].append(offline.add_request(
                _prompts(i)[k], SamplingParams(max_tokens=MAX_TOKENS), model=name))
    multiplexed_steps = 0
    while offline.core.has_work:
        batch_models = set()
        for message in offline.step():
            if isinstance(message, StepOutputs):
                batch_models = {offline.core.part_of(r) for r in message.tokens.request_ids}
        multiplexed_steps += len(batch_models) > 1
    assert multiplexed_steps, "some steps ran several models' parts"
    return {name: [r.output_token_ids for r in rs] for name, rs in requests.items()}


def test_block_costs_are_head_wise(shapes):
    assert units_per_block(shapes) == {"a": 8, "b": 8, "c": 12}  # layers x KV heads


def test_multiplexed_tokens_match_dedicated_with_chunked_prefill(model_dirs, shapes, dedicated):
    offline = _mux(model_dirs, shapes, num_units=12 * 64, chunk_size=24)
    assert _run(offline) == dedicated
    assert offline.core.pool.used_units == 0, "every unit back in the pool"


def test_multiplexed_tokens_match_dedicated_through_preemption(model_dirs, shapes, dedicated):
    # room for the longest request of the costliest model and a little more: the models
    # crowd each other out of the pool and preempt their own requests
    offline = _mux(model_dirs, shapes, num_units=12 * 8, chunk_size=32)
    assert _run(offline) == dedicated
    preempted = sum(p.scheduler.num_preemptions for p in offline.core.parts.values())
    assert preempted > 0, "the test must exercise preemption"
    assert offline.core.pool.used_units == 0


def test_multiplexed_tokens_match_dedicated_with_prefix_caching(model_dirs, shapes, dedicated):
    offline = _mux(model_dirs, shapes, num_units=12 * 64, chunk_size=64, prefix_caching=True)
    assert _run(offline) == dedicated
    for part in offline.core.parts.values():  # each model found its own shared prefix
        assert part.kv.stats.hit_tokens > 0



"""Grammar-constrained decoding in the engine (engines/grammar.py): the masks, the matcher
following its request's tokens, and constrained requests sharing batches with free ones
through preemption, on the tiny random-weight model (CPU) and the sim executor.

Covers: engines/grammar.py, engines/executors/logit_adjust.py, engines/executors/sampler.py.
"""
from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from engines.offline import Offline
from engines.executors.logit_adjust import apply_mask
from engines.executors.latency import make_latency
from engines.executors.sim_executor import SimExecutor
from engines.executors.sim_vocabulary import text_token_ids
from engines.executors.torch_executor import TorchExecutor
from engines.grammar import GrammarError, Grammars
from engines.request import Request
from engines.scheduler_config import SchedulerConfig
from ipc.params import GrammarSpec, SamplingParams

SCHEMA = {"type": "object", "properties": {
    "kind": {"enum": ["cat", "dog"]},
    "name": {"type": "string", "maxLength": 6},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    "at": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0,
                                                  "maximum": 99}},
           "required": ["x"], "additionalProperties": False}},
    "required": ["kind", "name", "at"], "additionalProperties": False}
SPEC = GrammarSpec("json_schema", json.dumps(SCHEMA))


@pytest.fixture(scope="module")
def grammars(tokenizer):
    return Grammars.for_tokenizer(tokenizer)


def _request(tokenizer, text: str = "hi", spec=SPEC, generated: str = "") -> Request:
    prompt = tokenizer.encode(text)
    request = Request("r", prompt, SamplingParams(max_tokens=64, grammar=spec))
    request.token_ids.extend(tokenizer.encode(generated, add_bos=False) if generated else [])
    return request


def _allowed_text(grammars, tokenizer, request) -> set[str]:
    mask = grammars.compute([request])
    return {tokenizer.decode([int(t)], skip_special_tokens=False)
            for t in mask.allowed_ids(0)}


def test_a_schema_that_does_not_compile_says_why(grammars):
    with pytest.raises(GrammarError, match="strin"):
        grammars.check(GrammarSpec("json_schema", '{"type": "strin"}'))
    with pytest.raises(GrammarError):
        grammars.check(GrammarSpec("regex", "a(b"))


def test_only_constrained_rows_are_masked(grammars, tokenizer):
    free = Request("free", tokenizer.encode("hi"), SamplingParams(max_tokens=4))
    constrained = _request(tokenizer)
    mask = grammars.compute([free, constrained, free])
    assert mask.rows == [1]
    logits = torch.randn(3, tokenizer.vocab_size)
    masked = apply_mask(logits.clone(), mask)
    assert torch.equal(masked[[0, 2]], logits[[0, 2]])
    allowed = set(mask.allowed_ids(0).tolist())
    finite = set(torch.isfinite(masked[1]).nonzero().flatten().tolist())
    assert finite == allowed and allowed  # JSON starts with "{": only tokens that can start it
    assert all(tokenizer.decode([t]).startswith("{") for t in allowed)


def test_enum_values_are_the_only_continuation(grammars, tokenizer):
    request = _request(tokenizer, generated='{"kind":"')
    allowed = _allowed_text(grammars, tokenizer, request)
    assert allowed and all("cat".startswith(t) or "dog".startswith(t)
                           or t.startswith(("cat", "dog")) for t in allowed)


def test_matcher_rolls_back_with_the_tokens_and_rebuilds_from_them(grammars, tokenizer):
    request = _request(tokenizer, generated='{"kind":"cat","name":"')
    inside_string = _allowed_text(grammars, tokenizer, request)
    del request.token_ids[-len(tokenizer.encode('cat","name":"', add_bos=False)):]
    rolled_back = _allowed_text(grammars, tokenizer, request)
    # a request resumed elsewhere: a fresh matcher built from the tokens it kept
    rebuilt = _request(tokenizer, generated='{"kind":"')
    assert rolled_back == _allowed_text(grammars, tokenizer, rebuilt) != inside_string


def test_a_resumed_request_continues_its_grammar(grammars, tokenizer):
    """A resume puts the output so far at the end of the prompt (`generated_before`)."""
    prompt = tokenizer.encode("hi") + tokenizer.encode('{"kind":"', add_bos=False)
    request = Request("r", prompt, SamplingParams(max_tokens=8, grammar=SPEC),
                      generated_before=len(tokenizer.encode('{"kind":"', add_bos=False)))
    assert _allowed_text(grammars, tokenizer, request) == _allowed_text(
        grammars, tokenizer, _request(tokenizer, generated='{"kind":"'))


def _valid(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


@pytest.fixture(scope="module")
def executor(tiny_models):
    return TorchExecutor(tiny_models["llama"], device="cpu", num_kv_blocks=24, block_size=4)


@pytest.mark.slow  # a minute of CPU decoding
def test_constrained_and_free_requests_share_batches_through_preemption(executor, tokenizer):
    prompts = [tokenizer.encode(f"pet number {i}") for i in range(8)]
    free = [SamplingParams(max_tokens=24) for _ in prompts[::2]]
    alone = Offline(executor, SchedulerConfig(chunk_size=64)).generate(prompts[::2], free)
    params = [SamplingParams(max_tokens=60, temperature=1.0, seed=i, grammar=SPEC) if i % 2
              else SamplingParams(max_tokens=24) for i in range(len(prompts))]
    engine = Offline(executor, SchedulerConfig(chunk_size=64))
    mixed = engine.generate(prompts, params)
    assert engine.core.scheduler.num_preemptions > 0  # 24 blocks of 4 tokens cannot hold them all
    # the free ones are what they are alone (greedy): a neighbour's mask does not leak
    assert [c.token_ids for c in mixed[::2]] == [c.token_ids for c in alone]
    constrained = mixed[1::2]
    assert any(c.finish_reason == "stop" for c in constrained)
    for c in constrained:
        text = tokenizer.decode(c.token_ids)
        assert _valid(text) if c.finish_reason == "stop" else len(c.token_ids) == 60


def test_sim_executor_draws_constrained_tokens_from_the_grammar(tokenizer, grammars):
    executor = SimExecutor(make_latency("zero"), vocabulary=text_token_ids(tokenizer),
                           grammars=grammars)
    engine = Offline(executor, SchedulerConfig(chunk_size=256))
    prompts = [tokenizer.encode(f"hi {i}") for i in range(6)]
    choice = GrammarSpec("choice", json.dumps(["yes", "no"]))
    params = [SamplingParams(max_tokens=30, seed=i, grammar=choice if i % 2 else SPEC)
              for i in range(6)] + [SamplingParams(max_tokens=5)]
    done = engine.generate(prompts + [tokenizer.encode("free")], params)
    for i, c in enumerate(done[:6]):
        text = tokenizer.decode(c.token_ids)
        if i % 2:
            assert c.finish_reason == "stop" and text in ("yes", "no")
        else:
            assert _valid(text) if c.finish_reason == "stop" else len(c.token_ids) == 30
    assert done[6].finish_reason == "length" and len(done[6].token_ids) == 5


def test_the_grammar_crosses_the_wire_and_a_decode_instance_continues_it(grammars, tokenizer):
    """A P/D hand-off: the decode instance gets the spec in the Submit's sampling and the
    tokens so far, and its matcher (rebuilt from them) allows what the prefill's would."""
    from engines.handoff import prefilled_request
    from ipc.codec import Encoder, instance_decoder
    from ipc.messages import Submit, SubmitPrefilled
    prompt = tokenizer.encode("hi")
    generated = tokenizer.encode('{"kind":"', add_bos=False)
    submit = Submit(request_id="r", prompt_token_ids=prompt, arrival_time=0.0,
                    sampling=SamplingParams(max_tokens=16, grammar=SPEC))
    message = SubmitPrefilled(submit=submit, token_ids=prompt + generated,
                              num_computed_tokens=len(prompt + generated) - 1)
    received = instance_decoder().decode(Encoder().encode(message))
    assert received == message and received.submit.sampling.grammar == SPEC
    request = prefilled_request(received, deadline=float("inf"))
    assert _allowed_text(grammars, tokenizer, request) == _allowed_text(
        grammars, tokenizer, _request(tokenizer, generated='{"kind":"'))


@pytest.mark.slow  # 200 requests of CPU decoding
def test_every_reply_that_stops_matches_the_schema(tiny_models, tokenizer):
    """The issue's target: 200 requests under a schema with nested objects, arrays, enums
    and required fields; each ending with `stop` is schema-valid JSON, the others `length`."""
    executor = TorchExecutor(tiny_models["llama"], device="cpu")
    engine = Offline(executor, SchedulerConfig(chunk_size=2048))
    done = engine.generate([tokenizer.encode(f"Pet {i} as JSON:") for i in range(200)],
                           [SamplingParams(max_tokens=80, temperature=1.0, seed=i, grammar=SPEC)
                            for i in range(200)])
    stopped = [c for c in done if c.finish_reason == "stop"]
    assert len(stopped) > 150
    assert all(_valid(tokenizer.decode(c.token_ids)) for c in stopped)
    assert all(len(c.token_ids) == 80 for c in done if c.finish_reason == "length")

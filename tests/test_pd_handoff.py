"""P/D disaggregation (DistServe layouts, `<n>P<m>D`) in the two cores, the policy that
picks a decode instance, and the KV copy between two torch executors' paged caches.

Covers: engines/handoff.py, daemon/core/handoffs.py, policies/decode_choice.py.
"""
from __future__ import annotations

import msgspec
import pytest

from daemon.core.controller_config import ControllerConfig, SloConfig
from daemon.core.controller_core import ControllerCore
from daemon.core.events import Arrived, FromInstance, Send, Settle, StartAccepting, Tokens
from daemon.layout import layout_modes, parse_layout
from daemon.core.request_state import Outcome, RequestState
from engines.handoff import ExportKv, ImportKv
from engines.modes import role_of_mode
from engines.offline import Offline
from engines.scheduler_config import SchedulerConfig
from ipc.codec import Encoder, controller_decoder, instance_decoder
from ipc.messages import (
    Handoff, KvLayout, Ready, Role, StepOutputs, StepTokens, Submit, SubmitPrefilled, TokenOutput,
)
from ipc.params import SamplingParams
from policies.decode_choice import DecodeView, choose_decode
from tests.fakes import FakeExecutor, FakeInstance, expected_output

PROMPT = [3, 4, 5, 6, 7, 8, 9]


# ---- layouts and the policy --------------------------------------------------------------

def test_pd_layouts_name_prefill_then_decode_instances():
    assert layout_modes("2P1D") == ["prefill", "prefill", "decode"]
    assert layout_modes("1P2D") == ["prefill", "decode", "decode"]
    assert [s.gpus for s in parse_layout("1P1D", [4, 5])] == [(4,), (5,)]
    assert [role_of_mode(m) for m in layout_modes("1P1D")] == [Role.PREFILL, Role.DECODE]


@pytest.mark.parametrize("layout", ["0P1D", "1P0D", "2xprefill", "1xdecode"])
def test_a_pd_layout_needs_both_kinds(layout):
    with pytest.raises(ValueError, match="layout"):
        layout_modes(layout)


def test_the_decode_choice_is_the_least_full_kv_that_fits():
    views = [DecodeView(1, 900, 1000, 3), DecodeView(2, 500, 1000, 9), DecodeView(3, 500, 2000, 9)]
    assert choose_decode(views, 50) == 3                      # 27.5 % full after, the least
    assert choose_decode(views[:2], 50) == 2
    assert choose_decode(views[:2], 600) == 1 or choose_decode(views[:2], 600) == 2
    assert choose_decode([DecodeView(1, 100, 1000, 5), DecodeView(2, 100, 1000, 2)], 10) == 2
    assert choose_decode([DecodeView(1, 990, 1000, 1), DecodeView(2, 995, 1000, 1)], 50) == 1
    assert choose_decode([], 10) is None


# ---- the instance core: hand off at the first token, take in and decode on ---------------

def instance(mode: str, role: Role, num_kv_blocks: int = 64, **scheduler) -> FakeInstance:
    return FakeInstance(5, role, SchedulerConfig(mode=mode, chunk_size=64, **scheduler),
                        FakeExecutor(num_kv_blocks=num_kv_blocks))


def submit(request_id: str = "a", max_tokens: int = 6) -> Submit:
    return Submit(request_id=request_id, prompt_token_ids=list(PROMPT),
                  sampling=SamplingParams(max_tokens=max_tokens), arrival_time=0.0,
                  deadline=10.0, ttft_slo=10.0, tbt_slo=1.0)


def run_to_end(driver: FakeInstance) -> list[int]:
    tokens = []
    while driver.core.has_work:
        for message in driver.step():
            if isinstance(message, StepOutputs):
                tokens += [o.token_id for o in message.tokens.outputs()]
    return tokens


def test_a_prefill_instance_hands_a_request_off_after_its_first_token():
    prefill = instance("prefill", Role.PREFILL)
    prefill.core.handle(submit(), now=0.0)
    messages = prefill.step()
    first = expected_output(PROMPT, 1)
    assert isinstance(messages[0], StepOutputs)
    assert [o.token_id for o in messages[0].tokens.outputs()] == first
    assert messages[0].admitted == ["a"]  # its prefill started this step
    assert messages[1] == Handoff(instance_id=5, request_id="a", token_ids=PROMPT + first,
                                  num_computed_tokens=len(PROMPT))
    assert not prefill.core.has_work and prefill.core.kv.num_free_blocks == 64
    assert len(messages) == 2  # the fake executor keeps no tensors: no KV to export


def test_a_request_that_ends_at_its_first_token_is_not_handed_off():
    prefill = instance("prefill", Role.PREFILL)
    prefill.core.handle(submit(max_tokens=1), now=0.0)
    messages = prefill.step()
    assert len(messages) == 1 and messages[0].tokens.outputs()[0].finish_reason is not None


def handed_off(max_tokens: int = 6) -> tuple[Handoff, SubmitPrefilled]:
    prefill = instance("prefill", Role.PREFILL)
    prefill.core.handle(submit(max_tokens=max_tokens), now=0.0)
    handoff = prefill.step()[1]
    return handoff, SubmitPrefilled(submit=submit(max_tokens=max_tokens),
                                    token_ids=handoff.token_ids,
                                    num_computed_tokens=handoff.num_computed_tokens)


def test_a_decode_instance_decodes_on_from_the_handed_off_kv():
    _, prefilled = handed_off()
    decode = instance("decode", Role.DECODE)
    decode.executor.cache["a"] = list(prefilled.token_ids[:-1])  # "the KV arrived"
    assert decode.core.handle(prefilled, now=1.0) == []
    request = decode.core.scheduler.requests["a"]
    assert request.is_decoding and request.num_computed_tokens == len(PROMPT)
    assert run_to_end(decode) == expected_output(PROMPT, 6)[1:]
    batches = decode.executor.batches
    assert all(c.num_tokens == 1 for b in batches for c in b.chunks)  # no prompt recomputed


def test_a_prefilled_request_waits_for_a_seat_with_its_kv():
    _, prefilled = handed_off()
    decode = instance("decode", Role.DECODE, max_num_seqs=1)  # one seat
    for rid in ("a", "b"):
        decode.executor.cache[rid] = list(prefilled.token_ids[:-1])
        assert decode.core.handle(SubmitPrefilled(submit=submit(rid), token_ids=prefilled.token_ids,
                                             num_computed_tokens=len(PROMPT)), now=1.0) == []
    assert "b" in decode.core.prefilled and "b" not in decode.core.scheduler.requests
    assert run_to_end(decode) == 2 * expected_output(PROMPT, 6)[1:]
    batches = decode.executor.batches
    assert all(c.num_tokens == 1 for b in batches for c in b.chunks)  # no prompt recomputed


def test_a_waiting_prefilled_request_can_be_aborted():
    _, prefilled = handed_off()
    decode = instance("decode", Role.DECODE, max_num_seqs=1)
    for rid in ("a", "b"):
        decode.executor.cache[rid] = list(prefilled.token_ids[:-1])
        decode.core.handle(SubmitPrefilled(submit=submit(rid), token_ids=prefilled.token_ids,
                                      num_computed_tokens=len(PROMPT)), now=1.0)
    from ipc.messages import Abort, Finished
    (finished,) = decode.core.handle(Abort(request_id="b"), now=1.0)
    assert isinstance(finished, Finished) and finished.request_id == "b"
    assert not decode.core.prefilled and decode.core.handle(Abort(request_id="b"), now=1.0) == []


def test_kv_a_decode_instance_cannot_use_is_recomputed():
    _, prefilled = handed_off()
    layout = KvLayout(num_layers=2, num_blocks=1, block_size=16, num_kv_heads=2, head_dim=8,
                      dtype="float32", num_tokens=len(PROMPT))
    decode = instance("decode", Role.DECODE)  # a cache-less executor: KV it cannot take
    decode.core.handle(SubmitPrefilled(submit=prefilled.submit, token_ids=prefilled.token_ids,
                                  num_computed_tokens=len(PROMPT), kv=layout), now=1.0)
    assert decode.core.scheduler.requests["a"].num_computed_tokens == 0
    assert run_to_end(decode) == expected_output(PROMPT, 6)[1:]


def test_a_prefilled_request_whose_tokens_do_not_start_with_its_prompt_is_refused():
    _, prefilled = handed_off()
    bad = SubmitPrefilled(submit=prefilled.submit, token_ids=[9, 9, 9],
                          num_computed_tokens=2)
    (error,) = instance("decode", Role.DECODE).core.handle(bad, now=1.0)
    assert error.request_id == "a" and "prompt" in error.message


def test_handoff_messages_cross_the_wire_unchanged():
    handoff, prefilled = handed_off()
    layout = KvLayout(num_layers=2, num_blocks=1, block_size=16, num_kv_heads=2, head_dim=8,
                      dtype="bfloat16", num_tokens=8)
    prefilled = SubmitPrefilled(submit=prefilled.submit, token_ids=prefilled.token_ids,
                                num_computed_tokens=prefilled.num_computed_tokens, kv=layout)
    encoder = Encoder()
    assert controller_decoder().decode(encoder.encode(handoff)) == handoff
    assert instance_decoder().decode(encoder.encode(prefilled)) == prefilled
    assert layout.shape == (2, 1, 16, 2, 8)


# ---- the controller core: prefill instance -> decode instance ----------------------------

def pd_core(decodes: int = 2) -> ControllerCore:
    roles = {0: Role.PREFILL, **{1 + i: Role.DECODE for i in range(decodes)}}
    core = ControllerCore(roles, ControllerConfig(), SloConfig(ttft_slo=1.0, tbt_slo=0.1))
    for i, role in roles.items():
        core.handle(FromInstance(0.0, Ready(instance_id=i, role=role, mode=role.value,
                                            executor="sim", pid=1, num_kv_blocks=10,
                                            block_size=16, max_model_len=128)))
    core.handle(StartAccepting(0.0))
    return core


def test_the_controller_routes_new_requests_to_prefill_and_hands_them_to_a_decode():
    core = pd_core()
    actions = core.handle(Arrived(1.0, "a", list(PROMPT), SamplingParams(max_tokens=3)))
    (send,) = [a for a in actions if isinstance(a, Send)]
    assert send.instance_id == 0 and isinstance(send.message, Submit)
    core.handle(FromInstance(1.1, StepOutputs(instance_id=0, step=1, time=1.1, step_seconds=0.1,
                                              tokens=StepTokens.of([TokenOutput("a", 42)]))))
    assert core.ledger.requests["a"].state is RequestState.STREAMING
    actions = core.handle(FromInstance(1.1, Handoff(instance_id=0, request_id="a",
                                                    token_ids=PROMPT + [42],
                                                    num_computed_tokens=len(PROMPT))))
    (send,) = [a for a in actions if isinstance(a, Send)]
    assert send.instance_id == 1 and send.message.token_ids == PROMPT + [42]
    assert send.message.submit.request_id == "a" and core.ledger.requests["a"].instance == 1
    assert "a" not in core.ledger.instances[0].held and "a" in core.ledger.instances[1].held
    actions = core.handle(FromInstance(1.2, StepOutputs(
        instance_id=1, step=1, time=1.2, step_seconds=0.01,
        tokens=StepTokens.of([TokenOutput("a", 43), ])))) + core.handle(FromInstance(1.3, StepOutputs(
            instance_id=1, step=2, time=1.3, step_seconds=0.01,
            tokens=StepTokens.of([TokenOutput("a", 44, finish_reason="length")]))))
    assert [t for a in actions if isinstance(a, Tokens) for t in a.tokens.token_ids] == [43, 44]
    (settle,) = [a for a in actions if isinstance(a, Settle)]
    assert settle.outcome is Outcome.COMPLETED and settle.instance == 1
    assert settle.instances == (0, 1) and not settle.offloaded  # prefill, then decode


def test_the_next_handoff_goes_to_the_decode_instance_with_more_room():
    core = pd_core()
    for rid, prompt_len, now in (("a", 100, 1.0), ("b", 10, 2.0)):
        core.handle(Arrived(now, rid, [3] * prompt_len, SamplingParams(max_tokens=3)))
        core.handle(FromInstance(now, StepOutputs(instance_id=0, step=1, time=now,
                                                  step_seconds=0.1, tokens=StepTokens.of([TokenOutput(rid, 4)]))))
        core.handle(FromInstance(now, Handoff(instance_id=0, request_id=rid,
                                              token_ids=[3] * prompt_len + [4],
                                              num_computed_tokens=prompt_len)))
    assert core.ledger.requests["a"].instance == 1 and core.ledger.requests["b"].instance == 2


def test_a_handoff_of_a_request_whose_client_left_is_dropped():
    core = pd_core()
    core.handle(Arrived(1.0, "a", list(PROMPT), SamplingParams(max_tokens=3)))
    from daemon.core.events import ClientLeft
    core.handle(ClientLeft(1.05, "a"))
    actions = core.handle(FromInstance(1.1, Handoff(instance_id=0, request_id="a",
                                                    token_ids=PROMPT + [1],
                                                    num_computed_tokens=len(PROMPT))))
    assert actions == []


# ---- the KV copy between two torch executors ----------------------------------------------

def torch_instance(model_dir, mode: str, role: Role, block_size: int) -> FakeInstance:
    from engines.executors.torch_executor import TorchExecutor
    executor = TorchExecutor(model_dir, block_size=block_size, num_kv_blocks=64, device="cpu")
    return FakeInstance(int(role is Role.DECODE), role, SchedulerConfig(mode=mode, chunk_size=32),
                        executor)


def generate_pd(prefill: FakeInstance, decode: FakeInstance, prompts, max_tokens: int):
    """Every prompt through prefill -> (wire bytes) -> decode; the tokens per request. The
    KV moves the cores ask for are made here, as the instance process's driver makes them."""
    encoder, tokens = Encoder(), {f"r{i}": [] for i in range(len(prompts))}
    in_flight: dict[str, list[bytes]] = {}  # the decode driver's frames, by request id
    for i, prompt in enumerate(prompts):
        prefill.core.handle(Submit(request_id=f"r{i}", prompt_token_ids=prompt,
                              sampling=SamplingParams(max_tokens=max_tokens), arrival_time=0.0),
                            now=0.0)

    def carry_out(driver: FakeInstance, outputs) -> None:
        executor = driver.executor
        for output in outputs:
            if isinstance(output, StepOutputs):
                for token in output.tokens.outputs():
                    tokens[token.request_id].append(token.token_id)
            elif isinstance(output, ImportKv):
                executor.import_kv(output.block_ids, output.layout,
                                   in_flight.pop(output.request_id))
            elif isinstance(output, ExportKv):
                layout, frames = executor.export_kv(output.block_ids, output.num_tokens)
                message = msgspec.structs.replace(output.handoff, kv=layout)
                wire = controller_decoder().decode(encoder.encode(message))
                in_flight[message.request_id] = [bytes(f) for f in frames]
                submit_ = Submit(request_id=message.request_id,
                                 prompt_token_ids=prompts[int(message.request_id[1:])],
                                 sampling=SamplingParams(max_tokens=max_tokens), arrival_time=0.0)
                outputs = decode.core.take([SubmitPrefilled(
                    submit=submit_, token_ids=wire.token_ids,
                    num_computed_tokens=wire.num_computed_tokens, kv=wire.kv)], now=1.0)
                assert all(isinstance(o, ImportKv) for o in outputs)
                carry_out(decode, outputs)
            else:
                assert not isinstance(output, Handoff), "a torch executor's KV travels"

    for driver in (prefill, decode):
        while driver.core.has_work:
            carry_out(driver, driver.step())
    assert not in_flight
    return list(tokens.values())


@pytest.mark.slow
@pytest.mark.parametrize("block_sizes", [(16, 16), (4, 16)])
def test_greedy_output_through_prefill_and_decode_equals_one_instance(tiny_models, block_sizes):
    """The KV that crosses (as bytes, between caches of possibly different block sizes) is
    the KV a single instance would have: greedy tokens are identical, and the decode
    instance recomputes no prompt."""
    from engines.executors.torch_executor import TorchExecutor
    model = tiny_models["llama"]
    prompts = [[(7 * i + 3 * n) % 500 + 5 for i in range(n)] for n in (5, 23, 40)]
    single = Offline(TorchExecutor(model, block_size=16, num_kv_blocks=64, device="cpu"),
                     SchedulerConfig(mode="sarathi", chunk_size=32))
    expected = [c.token_ids for c in single.generate(prompts, SamplingParams(max_tokens=12))]
    prefill = torch_instance(model, "prefill", Role.PREFILL, block_sizes[0])
    decode = torch_instance(model, "decode", Role.DECODE, block_sizes[1])
    assert generate_pd(prefill, decode, prompts, 12) == expected
    assert prefill.core.kv.num_free_blocks == 64 and decode.core.kv.num_free_blocks == 64
    assert decode.core.scheduler.num_preemptions == 0


# ---- the simulator: P/D layouts through the same cores, KV priced by the link -------------

@pytest.mark.slow
def test_a_simulated_pd_layout_serves_every_request_through_both_kinds():
    from tests.simulator_helpers import run
    result = run("2P1D", "sharegpt", qps=4, num_requests=120)
    assert result.completed == 120
    assert all(r.instances[0] in (0, 1) and r.instances[-1] == 2 for r in result.records
               if r.output_len > 1)
    roles = {row["id"]: row["role"] for row in result.per_instance}
    assert roles == {0: "prefill", 1: "prefill", 2: "decode"}


def test_kv_transfer_time_is_kv_bytes_over_the_link():
    from bench.sim.kv_transfer_time import kv_transfer_seconds
    from engines.executors.profiles.interconnect import SETUP_SECONDS, get_interconnect
    from engines.executors.profiles.registry import get_profile
    _, prefilled = handed_off()
    prefilled = SubmitPrefilled(submit=prefilled.submit, token_ids=[3] * 2049,
                                num_computed_tokens=2048)
    per_token = get_profile("a100-llama3-8b").kv_bytes_per_token
    assert per_token == 2 * 32 * 8 * 128 * 2  # Llama-3-8B, bf16: 128 KiB a token
    nvlink = kv_transfer_seconds("a100-llama3-8b", "", prefilled)
    pcie = kv_transfer_seconds("a100-llama3-8b", "pcie4", prefilled)
    assert nvlink == pytest.approx(SETUP_SECONDS + 2048 * per_token / (0.8 * 300e9))
    assert pcie == pytest.approx(SETUP_SECONDS + 2048 * per_token / (0.8 * 32e9))
    assert kv_transfer_seconds("a100-llama3-8b", "", submit()) == 0.0
    with pytest.raises(ValueError, match="interconnect"):
        get_interconnect("carrier-pigeon")


@pytest.mark.slow
def test_the_kv_link_delays_only_the_decode_side():
    from tests.simulator_helpers import run
    fast = run("1P1D", "sharegpt", qps=1, num_requests=40)
    slow = run("1P1D", "sharegpt", qps=1, num_requests=40, interconnect="pcie4")
    ttft = lambda res: [r.ttft() for r in res.records]  # noqa: E731
    assert ttft(fast) == ttft(slow)  # the first token comes from the prefill instance
    second = lambda res: sum(r.token_times[1] - r.token_times[0]  # noqa: E731
                             for r in res.records if len(r.token_times) > 1)
    assert second(slow) > second(fast)


def test_kv_frames_round_trip_between_block_sizes_and_bad_frames_are_refused():
    import torch

    from engines.models.kv_transfer import export_blocks, import_blocks
    torch.manual_seed(0)
    source = [(torch.randn(8, 4, 2, 3), torch.randn(8, 4, 2, 3)) for _ in range(2)]
    layout, frames = export_blocks(source, [5, 2, 7], 10, block_size=4)
    assert layout.shape == (2, 3, 4, 2, 3) and layout.dtype == "float32"
    target = [(torch.zeros(6, 8, 2, 3), torch.zeros(6, 8, 2, 3)) for _ in range(2)]
    import_blocks(target, [4, 1], layout, [bytes(f) for f in frames], block_size=8)
    for (k, v), (tk, tv) in zip(source, target):
        want = torch.cat([k[5], k[2], k[7]])[:10]
        assert torch.equal(torch.cat([tk[4], tk[1]])[:10], want)
        assert torch.equal(torch.cat([tv[4], tv[1]])[:10], torch.cat([v[5], v[2], v[7]])[:10])
    with pytest.raises(ValueError, match="frames"):
        import_blocks(target, [4, 1], layout, [b"short", b"frames"], block_size=8)
    with pytest.raises(ValueError, match="blocks cannot hold"):
        import_blocks(target, [4], layout, frames, block_size=8)

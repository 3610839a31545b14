"""ESP groups on the two cores: the controller forms a group for a long prompt (Submit with
`esp` to its master, EspJoin to the others, EspGo once all joined), each instance core holds
its stripe's KV and runs the group's prefill step, the master decodes, and the group
dissolves when the request ends or a member stops -- the request is never lost.

Covers: daemon/core/esp_groups.py, engines/esp_parts.py.
"""
from __future__ import annotations

import msgspec
import pytest

from daemon.core.controller_config import ControllerConfig, SloConfig
from daemon.core.controller_core import ControllerCore
from daemon.core.esp_groups import EspSettings, prefill_seconds
from daemon.core.events import (Arrived, EspChanged, FromInstance, InstanceDown, Moved, Send,
                                Settle, StartAccepting)
from daemon.core.request_state import Outcome, RequestState
from engines.esp_parts import EspStep
from engines.scheduler_config import SchedulerConfig
from ipc.messages import (Abort, EspGo, EspJoin, EspJoined, EspLeave, EspPart, Finished,
                          FinishReason, Ready, Role, StepOutputs, StepTokens, Submit, TokenOutput)
from ipc.params import SamplingParams
from tests.fakes import FakeExecutor, FakeInstance

PROMPT = list(range(5, 105))    # 100 tokens: stripes of 33 over 3 (the last is the master's)


def instance(instance_id: int = 0, num_kv_blocks: int = 64) -> FakeInstance:
    return FakeInstance(instance_id, Role.PEER, SchedulerConfig(mode="sarathi"),
                        FakeExecutor(num_kv_blocks=num_kv_blocks))


def esp_submit(group=(0, 1, 2), max_tokens: int = 3) -> Submit:
    return Submit(request_id="long", prompt_token_ids=PROMPT,
                  sampling=SamplingParams(max_tokens=max_tokens), arrival_time=0.0,
                  deadline=50.0, esp=EspPart(list(group), 0))


# -- the instance core --------------------------------------------------------------------

def test_a_holder_keeps_its_stripes_blocks_from_its_join_until_it_leaves():
    holder = instance(1).core
    free = holder.kv.num_free_blocks
    [answer] = holder.handle(EspJoin(request_id="long", prompt_token_ids=PROMPT,
                                     part=EspPart([0, 1, 2], 1)), now=0.0)
    assert answer == EspJoined(instance_id=1, request_id="long")
    stripe_blocks = -(-33 // holder.kv.block_size)        # 33 of the 99 tokens
    assert free - holder.kv.num_free_blocks == stripe_blocks
    holder.handle(EspGo(request_id="long"), now=0.1)
    step, outputs = holder.begin_step(0.2)
    assert step == EspStep("long", 99, 3, 1, 0, 99) and outputs == []   # one chunk
    holder.finish_esp(step, now=1.0)
    assert not holder.has_work and free - holder.kv.num_free_blocks == stripe_blocks
    assert holder.handle(EspLeave(request_id="long"), now=2.0) == []
    assert holder.kv.num_free_blocks == free


def test_the_master_decodes_after_the_groups_step_from_its_last_prompt_token():
    driver = instance(0)
    master = driver.core
    [answer] = master.handle(esp_submit(), now=0.0)
    assert answer == EspJoined(instance_id=0, request_id="long")
    batch, _ = master.begin_step(0.1)
    assert not batch                       # no Go yet: nothing to run
    master.handle(EspGo(request_id="long"), now=0.2)
    step, _ = master.begin_step(0.3)
    assert step.master and step.num_tokens == len(PROMPT) - 1
    driver.executor.cache["long"] = PROMPT[:-1]   # what the group's step computed
    master.finish_esp(step, now=1.0)
    request = master.scheduler.requests["long"]
    assert request.num_computed_tokens == len(PROMPT) - 1 and request.pinned
    first = driver.step(now=1.1)
    [outputs] = [m for m in first if isinstance(m, StepOutputs)]
    assert outputs.tokens.request_ids == ["long"]          # its first token
    while master.has_work:
        driver.step(now=1.2)
    assert master.kv.num_free_blocks == master.kv.num_blocks


def test_a_holder_without_room_refuses_and_an_alone_master_serves_by_itself():
    small = instance(2, num_kv_blocks=2).core
    [answer] = small.handle(EspJoin(request_id="long", prompt_token_ids=PROMPT,
                                    part=EspPart([0, 1, 2], 2)), now=0.0)
    assert "no KV room" in answer.refused and "long" not in small.esp
    master = instance(0).core
    master.handle(esp_submit(), now=0.0)
    assert master.handle(EspGo(request_id="long", alone=True), now=0.1) == []
    assert master.scheduler.requests["long"].num_computed_tokens == 0   # an ordinary prefill
    assert "long" not in master.esp


def test_an_abort_after_the_go_answers_at_once_but_the_step_still_runs():
    master = instance(0).core
    master.handle(esp_submit(), now=0.0)
    master.handle(EspGo(request_id="long"), now=0.1)
    assert master.handle(Abort(request_id="long"), now=0.2) == [
        Finished(instance_id=0, request_id="long", reason=FinishReason.ABORT)]
    step, _ = master.begin_step(0.3)       # the others wait for it in the step's collective
    assert isinstance(step, EspStep)
    master.finish_esp(step, now=1.0)
    assert "long" not in master.scheduler.requests
    assert master.kv.num_free_blocks == master.kv.num_blocks


def test_a_master_whose_group_lost_a_member_recomputes_the_request():
    driver = instance(0)
    master = driver.core
    master.handle(esp_submit(max_tokens=8), now=0.0)
    master.handle(EspGo(request_id="long"), now=0.1)
    step, _ = master.begin_step(0.2)
    driver.executor.cache["long"] = PROMPT[:-1]
    master.finish_esp(step, now=1.0)
    driver.step(now=1.1)
    master.handle(EspLeave(request_id="long"), now=1.2)   # a holder stopped: its KV is gone
    request = master.scheduler.requests["long"]
    assert request.num_computed_tokens == 0 and request.num_preemptions == 1
    assert len(request.token_ids) == len(PROMPT) + 1      # the token it sent stays sent


# -- the controller core ------------------------------------------------------------------

def ready(instance_id: int) -> Ready:
    return Ready(instance_id=instance_id, role=Role.PEER, mode="sarathi", executor="sim",
                 pid=100 + instance_id, num_kv_blocks=100, block_size=16, max_model_len=4096,
                 prefill_curve=[(16, 0.01), (64, 0.1), (128, 0.4)])


def controller(**settings) -> ControllerCore:
    core = ControllerCore({i: Role.PEER for i in range(3)}, ControllerConfig(),
                          SloConfig(ttft_slo=1.0, tbt_slo=0.1),
                          esp=EspSettings(max_degree=3, **settings))
    for i in range(3):
        core.handle(FromInstance(0.0, ready(i)))
    core.handle(StartAccepting(0.0))
    return core


def arrive(core, prompt=PROMPT, ttft_slo: float | None = None):
    return core.handle(Arrived(1.0, "long", list(prompt), SamplingParams(max_tokens=2),
                               ttft_slo=ttft_slo))


def joined_all(core, members) -> list:
    actions = []
    for m in members:
        actions += core.handle(FromInstance(1.1, EspJoined(instance_id=m, request_id="long")))
    return actions


def sends(actions):
    return [(a.instance_id, a.message) for a in actions if isinstance(a, Send)]


def token(instance_id: int, done: bool = False) -> FromInstance:
    finished = FinishReason.LENGTH if done else None
    return FromInstance(2.0, StepOutputs(instance_id=instance_id, step=1, time=2.0,
                                         step_seconds=0.01, tokens=StepTokens.of(
                                             [TokenOutput("long", 7, finished)])))


def test_a_prompt_that_misses_its_deadline_alone_gets_the_smallest_group_that_meets_it():
    # the curve says 100 tokens take 0.27 s alone (x1.3 while serving others): within 1 s
    [(_, submit)] = sends(arrive(controller()))
    assert submit.esp is None
    # with 0.3 s left it needs 2 instances (0.27 x 1.2 / 2 = 0.16 s)
    actions = arrive(controller(), ttft_slo=0.3)
    [(master, submit), (holder, join)] = sends(actions)
    assert submit.esp == EspPart([master, holder], 0)
    assert join == EspJoin(request_id="long", prompt_token_ids=PROMPT,
                           part=EspPart([master, holder], 1))
    # the curve past its end grows as its last two points do (x4 for twice the tokens)
    assert prefill_seconds(ready(0).prefill_curve, 256) == 1.6


def test_a_second_group_leaves_out_the_master_decoding_the_first():
    core = controller(min_tokens=50)
    [(master, submit), _] = sends(arrive(core))
    joined_all(core, submit.esp.group)
    core.handle(token(master))                   # the first long request now decodes there
    for i, name in enumerate(("chat1", "chat2")):   # short requests, one on each other instance
        core.handle(Arrived(1.5 + i, name, [1, 2, 3], SamplingParams(max_tokens=2)))
    assert sorted(len(v.held) for v in core.ledger.instances.values()) == [1, 1, 1]
    actions = core.handle(Arrived(3.0, "second", list(range(200, 300)),
                                  SamplingParams(max_tokens=2)))
    [second] = [m.esp.group for _, m in sends(actions) if isinstance(m, Submit)]
    # its step would stall the first request's decode on its master for the whole step
    assert len(second) == 2 and master not in second


def test_a_members_pending_group_step_counts_as_work_ahead_for_its_time_left():
    core = controller(min_tokens=50)
    [(master, submit), (holder, _)] = sends(arrive(core))     # arrived at 1.0
    group = core.esp.groups["long"]
    assert group.seconds > 0 and group.done_by == pytest.approx(1.0 + group.seconds)
    half = 1.0 + group.seconds / 2
    assert core.esp.busy_seconds(holder, half) == pytest.approx(group.seconds / 2)
    assert core.esp.busy_seconds(holder, 1.0 + 2 * group.seconds) == 0.0   # overdue: none
    free = ({0, 1, 2} - {master, holder}).pop()
    assert core.esp.busy_seconds(free, half) == 0.0
    joined_all(core, submit.esp.group)
    core.handle(token(master))                           # its prefill is over
    assert core.esp.busy_seconds(holder, half) == 0.0


def test_a_group_forms_when_all_joined_and_dissolves_when_its_request_ends():
    core = controller(min_tokens=50)
    [(master, submit), *joins] = sends(arrive(core))
    members = submit.esp.group
    assert len(members) == 2 and core.ledger.requests["long"].instance == master
    actions = joined_all(core, members)
    [formed] = [a for a in actions if isinstance(a, EspChanged)]
    assert formed.formed and formed.members == tuple(members) and "min_tokens 50" in formed.reason
    assert sends(actions) == [(m, EspGo(request_id="long")) for m in members]
    core.handle(token(master))
    actions = core.handle(token(master, done=True))
    assert [type(a) for a in actions if isinstance(a, Settle)] == [Settle]
    assert sends(actions) == [(members[1], EspLeave(request_id="long"))]
    [gone] = [a for a in actions if isinstance(a, EspChanged)]
    assert not gone.formed and gone.reason == "the request ended" and not core.esp.groups


def test_a_refusal_sends_the_master_alone_and_the_others_away():
    core = controller(min_tokens=50)
    [(master, submit), (holder, _)] = sends(arrive(core))
    actions = core.handle(FromInstance(1.1, EspJoined(instance_id=holder, request_id="long",
                                                       refused="no KV room")))
    assert sends(actions) == [(master, EspGo(request_id="long", alone=True)),
                              (holder, EspLeave(request_id="long"))]
    assert not [a for a in actions if isinstance(a, EspChanged)]   # it never formed
    assert core.ledger.requests["long"].instance == master


def test_a_holder_that_stops_ends_the_group_and_the_master_keeps_the_request():
    core = controller(min_tokens=50)
    [(master, submit), (holder, _)] = sends(arrive(core))
    joined_all(core, submit.esp.group)
    core.handle(token(master))
    actions = core.handle(InstanceDown(3.0, holder, exit_code=1))
    assert sends(actions) == [(master, EspLeave(request_id="long", lost=True))]   # recompute alone
    [gone] = [a for a in actions if isinstance(a, EspChanged)]
    assert gone.reason == f"instance {holder} stopped"
    tracked = core.ledger.requests["long"]
    assert tracked.instance == master and tracked.state is RequestState.STREAMING


def test_a_master_that_stops_moves_the_request_and_frees_the_holders():
    core = controller(min_tokens=50)
    [(master, submit), (holder, _)] = sends(arrive(core))
    joined_all(core, submit.esp.group)
    actions = core.handle(InstanceDown(3.0, master, exit_code=1))
    assert (holder, EspLeave(request_id="long", lost=True)) in sends(actions)
    [moved] = [a for a in actions if isinstance(a, Moved)]
    resubmit = dict(sends(actions))[moved.target]
    assert moved.target != master and resubmit.esp is None     # served alone, recomputed
    assert core.ledger.requests["long"].state is RequestState.QUEUED
    assert not [a for a in actions if isinstance(a, Settle)]   # not ended: it goes on


def test_the_metrics_count_groups_formed_and_dissolved_by_degree():
    from prometheus_client.parser import text_string_to_metric_families

    from daemon.metrics import Metrics
    metrics = Metrics()
    metrics.observe(EspChanged("a", (0, 1, 2), True, "predicted 20 s alone"))
    metrics.observe(EspChanged("a", (0, 1, 2), False, "the request ended"))
    metrics.observe(EspChanged("b", (1, 0), True, "predicted 18 s alone"))
    [family] = [f for f in text_string_to_metric_families(metrics.render().decode())
                if f.name == "ascendra_esp_groups"]
    counts = {(s.labels["event"], s.labels["degree"]): s.value for s in family.samples
              if s.name == "ascendra_esp_groups_total"}
    assert counts == {("formed", "3"): 1, ("dissolved", "3"): 1, ("formed", "2"): 1}


# -- the simulator: the same cores, the group's step priced on the profile ----------------

@pytest.mark.slow  # a few seconds of simulation
def test_long_prompts_get_groups_in_the_simulator_and_every_request_is_answered_once():
    from bench.sim.box_run import simulate
    from bench.sim.sim_instances import SimConfig
    from bench.studies.long_context import MAX_MODEL_LEN, PROFILE, mixed_workload
    from daemon.layout import layout_modes

    requests = mixed_workload(6.0, 0.05, 120.0, 15.0, seed=0)

    def run(degree: int):
        config = SimConfig(layout_modes=tuple(layout_modes("2L1H")), profile=PROFILE,
                           max_model_len=MAX_MODEL_LEN, esp=EspSettings(max_degree=degree))
        return simulate(config, requests, keep_records=True).records

    alone, grouped = run(1), run(3)
    assert all(r.outcome != "lost" for r in grouped)
    longs = [r for r in grouped if r.slo_class == "long"]
    assert not any(r.esp_group for r in alone)
    served = [r.esp_group[0] == r.instance for r in longs if r.esp_group]
    assert served and all(served)                        # its master decoded it
    assert all(r.outcome == "completed" for r in longs)
    met = sum(r.ttft() <= r.ttft_slo for r in longs)
    assert met > sum(r.ttft() <= r.ttft_slo for r in alone if r.slo_class == "long")
    # short prompts are never split
    assert not any(r.esp_group for r in grouped if r.slo_class == "short")


def test_health_lists_the_groups_joining_and_formed():
    from daemon.health import Health, build_health
    from tests.test_roles_observability import supervisor
    core = controller(min_tokens=50)
    [(_, submit), _] = sends(arrive(core))
    members = submit.esp.group
    [joining] = build_health(core.view, supervisor(3), "m", now=1.0).esp_groups
    assert (joining.request_id, joining.instances, joining.formed) == ("long", members, False)
    joined_all(core, members)
    health = build_health(core.view, supervisor(3), "m", now=1.2)
    decoded = msgspec.json.decode(msgspec.json.encode(health), type=Health)   # as served
    [formed] = decoded.esp_groups
    assert formed.formed and formed.instances == members and "min_tokens 50" in formed.reason
    core.handle(token(members[0], done=True))
    assert build_health(core.view, supervisor(3), "m", now=2.0).esp_groups == []


def test_without_a_performance_models_curve_only_an_operators_length_makes_a_group():
    core = ControllerCore({i: Role.PEER for i in range(3)}, ControllerConfig(),
                          SloConfig(ttft_slo=1.0, tbt_slo=0.1), esp=EspSettings(max_degree=3))
    for i in range(3):
        core.handle(FromInstance(0.0, msgspec.structs.replace(ready(i), prefill_curve=[])))
    core.handle(StartAccepting(0.0))
    [(_, submit)] = sends(arrive(core, ttft_slo=0.001))   # hopeless alone, but unpredicted
    assert submit.esp is None


def test_a_master_without_room_for_its_stripe_refuses_and_serves_the_request_alone():
    from engines.request import Request
    master = instance(0).core
    busy = Request("busy", [1] * 228, SamplingParams(max_tokens=1))
    assert master.kv.allocate(busy, 228)                  # 7 blocks of 4 left: 33 do not fit
    [answer] = master.handle(esp_submit(), now=0.0)
    assert "no KV room" in answer.refused
    assert "long" in master.scheduler.requests and "long" not in master.esp
    assert master.handle(EspGo(request_id="long", alone=True), now=0.1) == []


# -- gathering (an executor with real KV, the live path): the master ends with all of it --

def gathering(instance_id: int) -> FakeInstance:
    driver = instance(instance_id)
    driver.executor.carries_kv = True       # as the torch executor
    driver.core.esp.gathers = True
    return driver


def gather_into(driver: FakeInstance, step: EspStep) -> None:
    """What `EspSequence.gather_to` leaves on the master: position p's KV at slot p of
    the step's blocks."""
    size = driver.executor.block_size
    for p, token in enumerate(step.token_ids):
        driver.executor.slots[(step.block_table[p // size], p % size)] = token


def test_a_gathering_master_decodes_from_the_blocks_its_step_filled_and_a_holder_is_done():
    holder = gathering(1).core
    holder.handle(EspJoin(request_id="long", prompt_token_ids=PROMPT,
                          part=EspPart([0, 1, 2], 1)), now=0.0)
    holder.handle(EspGo(request_id="long"), now=0.1)
    step, _ = holder.begin_step(0.2)
    holder.finish_esp(step, now=1.0)
    assert holder.kv.num_free_blocks == holder.kv.num_blocks     # its stripe went to the master
    assert holder.handle(EspLeave(request_id="long"), now=2.0) == []

    driver = gathering(0)
    master = driver.core
    master.handle(esp_submit(max_tokens=4), now=0.0)
    whole = -(-(len(PROMPT) - 1) // master.kv.block_size)
    assert master.kv.num_blocks - master.kv.num_free_blocks == whole   # room for all of it
    master.handle(EspGo(request_id="long"), now=0.1)
    step, _ = master.begin_step(0.2)
    assert step.token_ids == PROMPT[:-1] and len(step.block_table) == whole
    gather_into(driver, step)
    master.finish_esp(step, now=1.0)
    request = master.scheduler.requests["long"]
    assert request.block_table == step.block_table                     # the same blocks
    assert request.num_computed_tokens == len(PROMPT) - 1
    master.handle(EspLeave(request_id="long"), now=1.05)   # a holder stopped: nothing lost
    assert request.num_preemptions == 0
    while master.has_work:           # the executor checks every chunk's context by slot
        driver.step(now=1.1)
    assert master.kv.num_free_blocks == master.kv.num_blocks


def test_a_failed_gathering_step_recomputes_the_prompt_on_the_master():
    driver = gathering(0)
    master = driver.core
    master.handle(esp_submit(max_tokens=2), now=0.0)
    master.handle(EspGo(request_id="long"), now=0.1)
    step, _ = master.begin_step(0.2)
    master.finish_esp(step, now=1.0, failed=True)        # a member died inside it
    assert master.scheduler.requests["long"].num_computed_tokens == 0
    while master.has_work:
        driver.step(now=1.1)
    assert master.kv.num_free_blocks == master.kv.num_blocks


def test_esp_settings_are_controller_config_fields_refused_with_tensor_parallelism(tmp_path):
    from daemon.config import load_config
    config = tmp_path / "c.toml"
    config.write_text("[instances]\ndevice = \"cpu\"\n"
                      "[controller]\nesp_max_degree = 3\nesp_min_tokens = 1000\n")
    assert load_config(str(config)).controller.esp == EspSettings(max_degree=3,
                                                                  min_tokens=1000)
    config.write_text("[controller]\nesp_max_degree = 0\n")
    with pytest.raises(ValueError, match=r"controller\.esp_max_degree"):
        load_config(str(config))
    config.write_text("[instances]\ntp = 2\ngpus = [0, 1]\n[controller]\nesp_max_degree = 2\n")
    with pytest.raises(ValueError, match=r"controller\.esp_max_degree: ESP groups of torch "
                                         r"instances need instances\.tp = 1"):
        load_config(str(config))
    config.write_text("[controller]\nesp_max_degree = 2\n")          # device "" = cuda if any
    with pytest.raises(ValueError, match=r"controller\.esp_max_degree: .* device = \"cpu\""):
        load_config(str(config))
    config.write_text("[model]\nmodel = [\"/m/a\", \"/m/b\"]\n"
                      "served_model_name = [\"a\", \"b\"]\nplacement = \"multiplexed\"\n"
                      "[instances]\ndevice = \"cpu\"\n[controller]\nesp_max_degree = 2\n")
    with pytest.raises(ValueError, match=r"controller\.esp_max_degree: .*one model"):
        load_config(str(config))


def test_a_member_waiting_in_its_step_hears_that_another_stopped():
    holder = gathering(1).core
    holder.handle(EspJoin(request_id="long", prompt_token_ids=PROMPT,
                          part=EspPart([0, 1, 2], 1)), now=0.0)
    holder.handle(EspGo(request_id="long"), now=0.1)
    step, _ = holder.begin_step(0.2)
    assert not holder.esp.lost("long")
    holder.handle(EspLeave(request_id="long", lost=True), now=0.3)   # instance 2 died
    assert holder.esp.lost("long")
    holder.finish_esp(step, now=0.4, failed=True)
    assert holder.kv.num_free_blocks == holder.kv.num_blocks and "long" not in holder.esp


def _run_member_with_chat(max_tokens: int, chunk_s: float = 0.5, step_s: float = 0.01):
    """A member decoding a chat request (TBT 0.15 s) joins a group whose 99-token prefill
    is cut in 3 chunks (token budget 16: 48 positions over 3); each chunk takes `chunk_s`
    (waiting for the others included), each step of its own `step_s`. Returns the
    member's turns in order ("chunk b-e" or "decode") and the chat's token times."""
    driver = FakeInstance(1, Role.PEER, SchedulerConfig(mode="sarathi", chunk_size=16),
                          FakeExecutor(num_kv_blocks=64))
    member = driver.core
    member.handle(Submit(request_id="chat", prompt_token_ids=list(range(5, 13)),
                         sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                         arrival_time=0.0, tbt_slo=0.15), now=0.0)
    now = 0.0
    driver.step(now, step_s)                                   # its prefill: first token
    chat = member.scheduler.requests["chat"]
    turns, token_times = [], [chat.first_token_time]
    member.handle(EspJoin(request_id="long", prompt_token_ids=PROMPT,
                          part=EspPart([0, 1, 2], 1)), now=now)
    member.handle(EspGo(request_id="long"), now=now)
    while member.has_work:
        step, _ = member.begin_step(now)
        if isinstance(step, EspStep):
            turns.append(f"chunk {step.begin}-{step.stop}")
            now += chunk_s
            member.finish_esp(step, now)
        else:
            assert [c.request.request_id for c in step.chunks] == ["chat"]
            turns.append("decode")
            now += step_s
            member.finish_step(step, driver.executor.execute(step), step_s, now)
            token_times.append(now)
    assert "long" in member.esp                                 # its stripe held
    return turns, token_times


def test_a_decode_that_cannot_wait_another_chunk_gets_its_steps_between_the_chunks():
    """8 tokens at 0.15 s: 1.05 s for its last. It can wait the first chunk (0.5 s); after
    it, its slack (0.48 s) no longer covers another: it decodes to its end before the
    second chunk. Without those steps its tokens would wait for all three chunks (1.5 s):
    a mean TBT of 0.22 s -- this test fails so."""
    turns, token_times = _run_member_with_chat(max_tokens=8)
    assert turns == ["chunk 0-48", *["decode"] * 7, "chunk 48-96", "chunk 96-99"]
    assert (token_times[-1] - token_times[0]) / 7 <= 0.15       # its mean TBT kept


def test_a_decode_with_slack_lets_the_groups_chunks_go_first():
    """100 tokens at 0.15 s: 14.85 s for its last, far more than the group's 1.5 s: the
    chunks run back to back, then it decodes, its mean TBT still kept."""
    turns, token_times = _run_member_with_chat(max_tokens=100)
    assert turns[:3] == ["chunk 0-48", "chunk 48-96", "chunk 96-99"]
    assert turns[3:] == ["decode"] * 99
    assert (token_times[-1] - token_times[0]) / 99 <= 0.15


def test_a_group_prefilled_in_chunks_hands_its_master_the_whole_prompt():
    """The master's request enters its scheduler only after the last chunk, with every
    prompt token but the last computed."""
    driver = FakeInstance(0, Role.PEER, SchedulerConfig(mode="sarathi", chunk_size=16),
                          FakeExecutor(num_kv_blocks=64))
    master = driver.core
    master.handle(esp_submit(), now=0.0)
    master.handle(EspGo(request_id="long"), now=0.0)
    for now, stop in ((0.5, 48), (1.0, 96)):
        step, _ = master.begin_step(now - 0.5)
        assert isinstance(step, EspStep) and step.stop == stop and not step.last
        master.finish_esp(step, now)
        assert "long" not in master.scheduler.requests
    step, _ = master.begin_step(1.0)
    assert step.last
    master.finish_esp(step, 1.5)
    assert master.scheduler.requests["long"].num_computed_tokens == len(PROMPT) - 1


def _member_with_a_chat_decoding() -> FakeInstance:
    """A peer (chunks of 16) whose chat request (8 tokens, TBT 0.15 s) has its first token."""
    driver = FakeInstance(1, Role.PEER, SchedulerConfig(mode="sarathi", chunk_size=16),
                          FakeExecutor(num_kv_blocks=64))
    driver.core.handle(Submit(request_id="chat", prompt_token_ids=list(range(5, 13)),
                              sampling=SamplingParams(max_tokens=8, ignore_eos=True),
                              arrival_time=0.0, tbt_slo=0.15), now=0.0)
    driver.step(0.0)                                            # chat's first token
    return driver


def test_a_member_waiting_for_the_others_at_a_chunk_steps_its_decodes_and_nothing_else():
    """The driver knows the others are not at the chunk yet: the member's waiting step is
    its running decodes (free: the group cannot start); a queued prompt waits."""
    driver = _member_with_a_chat_decoding()
    member = driver.core
    assert not member.waiting_step(0.1)                         # no group: nothing to wait for
    member.handle(EspJoin(request_id="long", prompt_token_ids=PROMPT,
                          part=EspPart([0, 1, 2], 1)), now=0.1)
    member.handle(EspGo(request_id="long"), now=0.1)
    member.handle(Submit(request_id="queued", prompt_token_ids=list(range(5, 40)),
                         sampling=SamplingParams(max_tokens=2), arrival_time=0.1), now=0.1)
    batch = member.waiting_step(0.2)
    assert [c.request.request_id for c in batch.chunks] == ["chat"]
    assert all(c.is_decode for c in batch.chunks)


def test_a_step_between_chunks_leaves_the_members_prefill_rate_as_it_was():
    """A member's decode-only step between a group's chunks, with a prompt queued there,
    prefilled nothing because the group holds it, not because it is slow: its reported
    prefill rate (the waiting room's view of its speed) is not taught a zero."""
    driver = _member_with_a_chat_decoding()
    member = driver.core
    member.handle(EspJoin(request_id="long", prompt_token_ids=PROMPT,
                          part=EspPart([0, 1, 2], 1)), now=0.0)
    member.handle(EspGo(request_id="long"), now=0.0)
    member.handle(Submit(request_id="queued", prompt_token_ids=list(range(5, 40)),
                         sampling=SamplingParams(max_tokens=2), arrival_time=0.0), now=0.0)
    member.prefill_rate = 1000.0
    chunk, _ = member.begin_step(0.0)
    member.finish_esp(chunk, 0.5)
    step, _ = member.begin_step(0.5)                            # the chat cannot wait more
    assert [c.request.request_id for c in step.chunks] == ["chat"]
    member.finish_step(step, driver.executor.execute(step), 0.01, 0.51)
    assert member.prefill_rate == 1000.0
    assert member.scheduler.queued_prefill()[0] > 0             # the prompt still queued


def three_lps(esp: EspSettings) -> ControllerCore:
    core = ControllerCore({i: Role.LP for i in range(3)}, ControllerConfig(shed="drop"),
                          SloConfig(ttft_slo=1.0, tbt_slo=0.1), esp=esp)
    for i in range(3):
        core.handle(FromInstance(0.0, msgspec.structs.replace(ready(i), role=Role.LP,
                                                              num_kv_blocks=1000)))
    core.handle(StartAccepting(0.0))
    return core


@pytest.mark.parametrize("esp_on", [False, True])
def test_with_groups_on_a_chat_request_goes_to_an_idle_lp_beside_a_long_prompt(esp_on):
    """`3A+esp3`'s short class (docs/elastic_sequence_parallelism.md, "3A's short
    class"): LP 0 holds a 1,200-token prompt served alone (3.75 s of backlog), LPs 1 and 2
    are idle. With ESP groups on the waiting room plans per LP and sends the chat request
    to LP 1 at once; off, it keeps the pooled plan (records byte-identical), which counts a
    third of LP 0's backlog ahead of it and drops it."""
    core = three_lps(EspSettings(max_degree=3 if esp_on else 1))
    long = core.handle(Arrived(1.0, "long", list(range(1200)), SamplingParams(max_tokens=2),
                               ttft_slo=100.0))
    assert [(i, type(m)) for i, m in sends(long)] == [(0, Submit)]   # no group: it fits alone
    chat = core.handle(Arrived(1.1, "chat", list(range(20)), SamplingParams(max_tokens=2)))
    if esp_on:
        assert [(i, m.request_id) for i, m in sends(chat)] == [(1, "chat")]
    else:
        assert not sends(chat)
        assert [a.outcome for a in chat if isinstance(a, Settle)] == [Outcome.DROPPED]

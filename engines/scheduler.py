"""The scheduler: decides what each engine step runs. Pure -- no I/O, no clock.

`schedule(now)` builds a batch, `update(batch, sampled, now)` applies the step's
results. Derived from Sarathi-Serve's stall-free batching: in decode-first modes
every running decode is taken, then prefill chunks fill what is left of the token
budget; in prefill-first modes (vLLM V0, SGLang) waiting prompts are admitted while any
fit and decodes wait. Waiting prompts are admitted by Algorithm 1 (docs/design.md §5.3)
(`policies.selection`), in arrival or value order as the mode says; LP modes first
hand requests that would miss their deadline to an HP instance (`batch.offloaded`)
and, with `drop_expired`, give up on unreachable ones (`batch.dropped`).

When KV blocks run out, a running request is preempted by recompute: it frees its
blocks, keeps its tokens and goes back to the waiting queue -- the last admitted, to the
front of the queue (vLLM), or, in SGLang's mode, the one that generated fewest tokens, to
its back. The baseline modes' admission rules (a watermark, no admission in a step that
preempted, room kept for running requests' output) are in engines/modes.py and
docs/baselines.md.

With prefix caching (engines/kv_cache.py) a request joins the queue with the cached
prefix it would find as its computed tokens (a hint the policies price it by), takes
that prefix at admission, and names the blocks it fills after each step; a preempted
request usually finds its own blocks again.
"""
from __future__ import annotations

import itertools
import math

import msgspec
import numpy as np

from engines.batch import Batch
from engines.kv_cache import BlockManager
from engines.modes import Mode, get_mode
from engines.request import FinishReason, Request, RequestStatus
from engines.scheduler_config import SchedulerConfig
from engines.triage import Triage
from engines.waiting_queue import WaitingQueue
from ipc.messages import StepTokens
from policies import output_reserve
from policies.admission import DecodeLengthHistory, decode_reserve, decode_reserve_columns
from policies.batch_shape import BatchShape
from policies.tbt_budget import step_time_allowed, whole_prefill_pays
from policies.predictor import Predictor, ZeroPredictor, remaining_prefill_time
from policies.selection import select_prefills, tokens_within

#: Modes that size steps by TBT slack may run up to this many token budgets in one step.
STEP_STRETCH = 2

__all__ = ["Scheduler", "SchedulerConfig"]


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: BlockManager, max_model_len: int,
                 eos_token_ids: frozenset[int] | set[int] = frozenset(),
                 predictor: Predictor | None = None) -> None:
        self.config = config.validate()
        self.mode: Mode = get_mode(config.mode)
        self.kv = kv
        self.max_model_len = min(max_model_len, kv.num_blocks * kv.block_size)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.token_budget = config.chunk_size
        self.max_num_seqs = config.resolved_max_num_seqs()
        self.predictor: Predictor = predictor or ZeroPredictor()
        self.triage = Triage(self.mode, config, self.predictor)
        self.decode_lengths = DecodeLengthHistory()
        self.waiting = WaitingQueue(self.predictor, self.token_budget)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}  # every unfinished request, by id
        self.num_preemptions = 0
        #: num_preemptions when the step being scheduled began (modes that admit nothing
        #: in a step that preempted compare against it)
        self._preemptions_before_step = 0
        #: SGLang's new-token ratio (modes with reserve_output; policies/output_reserve.py)
        self.new_token_ratio = output_reserve.INIT_RATIO

    # ---- requests in and out -------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if request.num_prompt_tokens >= self.max_model_len:
            raise ValueError(
                f"prompt has {request.num_prompt_tokens} tokens; this instance serves at most "
                f"{self.max_model_len - 1} prompt tokens (context limit {self.max_model_len})")
        request.max_total_tokens = min(request.max_total_tokens, self.max_model_len)
        self.requests[request.request_id] = request
        self.kv.match_prefix(request)  # before it joins: the queue reads it once
        self.waiting.append(request)

    def add_prefilled(self, request: Request, num_cached_tokens: int,
                      blocks: list[int] | None = None) -> bool:
        """Queue a request whose first `num_cached_tokens` tokens have their KV computed
        elsewhere (a P/D layout's prefill instance; engines/handoff.py). True: it runs
        from now, with blocks allocated for those tokens for the caller to fill -- or
        `blocks`, held already and holding that KV (an ESP group's gathered prompt,
        engines/esp_parts.py). False (no KV, no seat, or nothing cached): it waits to
        recompute them, as a preempted request does (`blocks` freed). Raises ValueError as
        `add_request` does (`blocks` still held: the caller frees them)."""
        self.add_request(request)
        if blocks:
            request.block_table = blocks
        if not num_cached_tokens or len(self.running) >= self.max_num_seqs:
            self.kv.free(request)
            return False
        if not blocks and not self.kv.allocate(request, num_cached_tokens):
            return False
        self.waiting.remove(request)
        request.num_computed_tokens = num_cached_tokens
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        return True

    def recompute(self, request_id: str) -> bool:
        """A running request whose KV is partly gone (an ESP group's other instance left,
        engines/esp_parts.py) recomputes it, preempted as if short of blocks; False when
        no such request runs here."""
        request = self.requests.get(request_id)
        if request is None or request.status is not RequestStatus.RUNNING:
            return False
        self._preempt(request, None)
        request.prefix_hit, request.num_computed_tokens = [], 0  # its blocks' KV is not all here
        return True

    def abort(self, request_id: str) -> Request | None:
        """Finish a request early, freeing its blocks; None if it is unknown or already done."""
        request = self.requests.get(request_id)
        if request is None:
            return None
        if request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        else:
            self.running.remove(request)
        self._finish(request, FinishReason.ABORT)
        return request

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- a role change (docs/design.md §5.10) --------------------------------------------
    def set_mode(self, name: str) -> None:
        """Schedule by mode `name` from the next step: its triage (value function,
        offloads) and default seat count; the KV cache, the predictor and every request
        stay. Between steps only (the instance core's `take`)."""
        config = msgspec.structs.replace(self.config, mode=name).validate()
        self.config, self.mode = config, get_mode(name)
        self.max_num_seqs = config.resolved_max_num_seqs()
        self.triage = Triage(self.mode, config, self.predictor)

    def give_back_waiting(self) -> list[Request]:
        """Take every waiting request whose prefill has not started (and is not pinned)
        out of the queue, finished here as an offload is (prompt tokens only leave), in
        queue order; the rest -- preempted, pinned -- stay."""
        going = [r for r in self.waiting if not r.prefill_started]
        self.waiting.remove_many(going)
        for request in going:
            self._finish(request, FinishReason.OFFLOAD)
        return going

    def queued_prefill(self) -> tuple[int, float]:
        """(prompt tokens not yet computed, their predicted seconds), waiting or mid-prefill:
        the prefill work this instance has ahead of it."""
        prefilling = [r for r in self.running  # not `is_decoding`, written out
                      if not ((n := len(r.token_ids)) - r.num_computed_tokens == 1
                              and n > r.num_prompt_tokens)]
        tokens = self.waiting.uncomputed_tokens() + sum(r.num_uncomputed_tokens for r in prefilling)
        seconds = sum(self.waiting.predicted_seconds() + [
            remaining_prefill_time(r, self.predictor, self.token_budget) for r in prefilling])
        return tokens, seconds

    def queued_sheddable_tokens(self) -> int:
        """Of `queued_prefill`'s tokens, those of waiting sheddable requests (a negative
        serving class: priority < 0), which every other request is admitted before. A
        prompt already started is not among them: its chunks go first, whatever its class."""
        return self.waiting.sheddable_uncomputed_tokens()

    # ---- scheduling ---------------------------------------------------------------------
    def schedule(self, now: float) -> Batch:
        batch = Batch()
        self._preemptions_before_step = self.num_preemptions
        decodes, prefilling = self._split_running()
        candidates = self._candidates(batch, now, decodes)
        if self.mode.prefill_first:
            budget, _ = self._continue_prefills(batch, prefilling, self._max_prefill_tokens())
            self._admit(batch, candidates, budget, math.inf, decodes)
            if not batch:
                self._schedule_decodes(batch, decodes)
        else:
            self._schedule_decodes(batch, decodes)
            budget = self._step_tokens() - batch.num_tokens
            if prefilling or self._admission_head(candidates, budget) is not None:
                # else no one would spend it
                compute, decode_seconds = self._compute_budget(batch, now)
                if self.mode.whole_prefill_for_ttft:
                    budget, compute = self._whole_prefill(prefilling, candidates, budget,
                                                          compute, decode_seconds, now)
                budget, compute = self._continue_prefills(batch, prefilling, budget, compute)
                self._admit(batch, candidates, budget, compute, decodes)
        if self.mode.reserve_output:
            self._update_new_token_ratio(batch)
        return batch

    def schedule_decodes(self) -> Batch:
        """A step of the running decodes only, and of the requests one token short of
        their first (an ESP group's prompt: its master computes the last token): what an
        instance runs between two chunks of a group's prefill (engines/instance_core.py)."""
        batch = Batch()
        self._preemptions_before_step = self.num_preemptions
        decodes, prefilling = self._split_running()
        self._schedule_decodes(batch, decodes)
        for request in prefilling:
            if (request.status is RequestStatus.RUNNING and request.num_uncomputed_tokens == 1
                    and self._make_room(request, 1, batch)):
                batch.add(request, 1)
        return batch

    @property
    def _preempted_this_step(self) -> bool:
        return self.num_preemptions > self._preemptions_before_step

    def _update_new_token_ratio(self, batch: Batch) -> None:
        """SGLang's ratio: back to its start when idle, raised to what the requests kept
        have used after a retraction, else one decay step per decode step."""
        if not self.running:
            self.new_token_ratio = output_reserve.INIT_RATIO
        elif self._preempted_this_step:
            self.new_token_ratio = output_reserve.ratio_after_retraction(
                (r.num_output_tokens for r in self.running),
                (r.max_total_tokens - r.num_prompt_tokens for r in self.running))
        elif batch.first_is_decode:
            self.new_token_ratio = output_reserve.decayed(self.new_token_ratio)

    def _split_running(self) -> tuple[list[Request], list[Request]]:
        """(decoding, prefilling): the running requests whose next step is one decode
        (`is_decoding`, written out), and the others, each in running order. Read once per
        step, before anything changes them: the triage, the decodes and the decode reserve
        share it."""
        running = self.running
        decodes = [r for r in running
                   if (n := len(r.token_ids)) - r.num_computed_tokens == 1
                   and n > r.num_prompt_tokens]
        if len(decodes) == len(running):
            return decodes, []
        is_decode = set(map(id, decodes))
        return decodes, [r for r in running if id(r) not in is_decode]

    def _whole_prefill(self, prefilling: list[Request], candidates, budget: int,
                       compute: float, decode_seconds: float, now: float) -> tuple[int, float]:
        """The token and compute budgets, raised to the whole of the next prompt's prefill
        (the first prompt under way, else the admission head) when it meets its TTFT only
        that way beside the step's decodes (`decode_seconds`; `tbt_budget.whole_prefill_pays`)."""
        head = prefilling[0] if prefilling else self._admission_head(candidates, budget)
        if head is None or head.first_token_time is not None:
            return budget, compute
        left = len(head.token_ids) - head.num_computed_tokens
        whole = self.predictor.prefill_time(left, head.num_computed_tokens)
        if not whole_prefill_pays(now, head.deadline, decode_seconds, whole, compute):
            return budget, compute
        return max(budget, left), max(compute, whole)

    def _step_tokens(self) -> int:
        """The step's token budget: `chunk_size`, stretched up to STEP_STRETCH times in modes
        that size steps by their decodes' TBT slack (the compute budget then decides how
        much of it the step may use: more while decodes are ahead of their targets)."""
        if self.mode.compute_budget:
            return STEP_STRETCH * self.token_budget
        return self.token_budget

    def _candidates(self, batch: Batch, now: float, decodes: list[Request]):
        """Waiting requests in admission order, after drops and offloads leave the queue
        (`decodes`: the running decodes, which the triage reads before any changes)."""
        if not self.waiting or not (self.mode.by_value or self.triage.active):
            return self.waiting
        ordered, offloaded, dropped = self.triage.run(
            self.waiting, now,
            lambda: self._next_batch_time([len(r.token_ids) for r in decodes]))
        for request in offloaded:
            self._finish(request, FinishReason.OFFLOAD)
        for request in dropped:
            self._finish(request, FinishReason.DROP)
        batch.offloaded, batch.dropped = offloaded, dropped
        return ordered

    def _next_batch_time(self, contexts: list[int]) -> float:
        """Predicted seconds until this instance could start a waiting prompt: its decodes
        (of these context lengths)."""
        return self.predictor.batch_time(BatchShape.of(decodes=contexts)) if contexts else 0.0

    def _max_prefill_tokens(self) -> int:
        """A prefill-first step that runs whole prompts must fit the longest one."""
        if self.mode.chunked_prefill:
            return self.token_budget
        return max(self.token_budget, self.max_model_len)

    def _compute_budget(self, batch: Batch, now: float) -> tuple[float, float]:
        """(seconds left for new prefills before the step costs a running request its TBT
        target -- `policies.tbt_budget`: mean TBT, as goodput counts it --, predicted
        seconds of the step so far). The second is 0 where the first is unbounded (no
        budget, nothing scheduled, no TBT target): nothing then depends on it."""
        if not self.mode.compute_budget or not batch:
            return math.inf, 0.0
        allowed = step_time_allowed(batch.requests(), now)
        if not math.isfinite(allowed):
            return math.inf, 0.0
        seconds = self.predictor.batch_time(batch.shape())
        return max(0.0, allowed - seconds), seconds

    def _schedule_decodes(self, batch: Batch, decodes: list[Request]) -> None:
        """Take every running decode (`decodes`, oldest first); preempt from the newest end
        if short of KV."""
        bs, running = self.kv.block_size, RequestStatus.RUNNING
        # First the commonest case, in bulk: the decodes that open a block get it, in
        # order, until one is preempted already or finds no free block; up to that one
        # this is what the loop below does (a preempted request holds no blocks, so it
        # is among those that open one).
        allocate, start = self.kv.allocate, len(decodes)
        for i in [i for i, r in enumerate(decodes)
                  if r.num_computed_tokens >= len(r.block_table) * bs]:
            request = decodes[i]
            if request.status is not running or not allocate(request, 1):
                start = i
                break
        if start == len(decodes):
            batch.add_decodes(decodes)
            return
        # The rest one by one. Added to the batch at once, and before a preemption (a
        # failed allocate changes nothing), which must see them there.
        taken: list[Request] = decodes[:start]
        for request in decodes[start:]:
            if request.status is not running:
                continue  # preempted meanwhile, to make room for an earlier one
            if (request.num_computed_tokens >= len(request.block_table) * bs
                    and not self.kv.allocate(request, 1)):
                batch.add_decodes(taken)
                taken = []
                if not self._make_room(request, 1, batch):
                    self._preempt(request, batch)
                    continue
            taken.append(request)
        batch.add_decodes(taken)

    def _continue_prefills(self, batch: Batch, prefilling: list[Request], budget: int,
                           compute: float = math.inf) -> tuple[int, float]:
        """Next chunks of prompts already started (`prefilling`: the running requests not
        decoding), in admission order, within the token budget and the compute budget (a
        chunk is cut to what fits; the first always gets at least one KV block's worth, so
        a prompt never stalls). Returns both left."""
        first = True
        for request in prefilling:
            if budget <= 0:
                break
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted meanwhile, to make room for an earlier one
            n = min(request.num_uncomputed_tokens, budget)
            if math.isfinite(compute):
                seconds = self.predictor.prefill_time(n, request.num_computed_tokens)
                if seconds > compute:
                    floor = self.kv.block_size if first else 0
                    n = max(tokens_within(request, n, compute, self.predictor, self.kv.block_size),
                            min(floor, n))
                    if n == 0:
                        break
                compute = max(0.0, compute - self.predictor.prefill_time(
                    n, request.num_computed_tokens))
            if self._make_room(request, n, batch):
                batch.add(request, n)
                budget -= n
                first = False
        return budget, compute

    def _admit(self, batch: Batch, candidates, budget: int, compute_budget: float,
               decodes: list[Request]) -> None:
        """Admit waiting requests by Algorithm 1 (docs/design.md §5.3): stop at the first that
        does not fit."""
        if self._admission_head(candidates, budget) is None:
            return
        if not self.mode.admit_after_preempt and self._preempted_this_step:
            return
        seat_limit = self.max_num_seqs - len(self.running)
        free = self.kv.num_free_blocks - self._watermark_blocks()
        count_blocks = self.kv.admission_blocks
        if self.mode.elastic_batch:
            free -= self._decode_reserve(decodes)
        if self.mode.reserve_output:
            free -= self._output_reserve_blocks()
            count_blocks = self._blocks_with_output
        selected = select_prefills(
            candidates, token_budget=budget, free_blocks=max(free, 0),
            block_size=self.kv.block_size, seat_limit=seat_limit,
            compute_budget=compute_budget, predictor=self.predictor,
            chunked=self.mode.chunked_prefill,
            cut_to_compute=self.mode.compute_budget, count_blocks=count_blocks)
        if self.kv.prefix_caching:
            selected = self._take_prefixes(selected)
        for request, n in selected:
            self.kv.allocate(request, n)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            batch.add(request, n)
            batch.admitted.append(request)
        for request, _ in selected:
            self.waiting.remove(request)

    def _watermark_blocks(self) -> int:
        """KV blocks admission leaves free (vLLM V0's watermark). None while nothing runs:
        the watermark keeps running requests from being preempted, and a prompt that fits
        the cache only without it would otherwise wait for ever (vLLM V0 refuses it as
        too long instead; here it is served)."""
        if not self.running:
            return 0
        return int(self.mode.admission_watermark * self.kv.num_blocks)

    def _output_reserve_blocks(self) -> int:
        """KV blocks kept for the output running requests are expected to still write."""
        tokens = output_reserve.running_reserve_tokens(
            (r.max_total_tokens - len(r.token_ids) for r in self.running), self.new_token_ratio)
        return -(-tokens // self.kv.block_size)

    def _blocks_with_output(self, request: Request, num_new_tokens: int) -> int:
        """Blocks admitting `request` takes: its new tokens', and its own output reserve."""
        left = request.max_total_tokens - len(request.token_ids)
        output = output_reserve.new_request_reserve(left)
        return self.kv.admission_blocks(request, num_new_tokens) + -(-output // self.kv.block_size)

    def _admission_head(self, candidates, budget: int) -> Request | None:
        """The first candidate, if admission may take it: token budget left, and a seat free
        unless it holds blocks already (no need to reckon KV otherwise). Else None."""
        head = next(iter(candidates), None) if budget > 0 else None
        if head is None or (len(self.running) >= self.max_num_seqs and not head.block_table):
            return None
        return head

    def _decode_reserve(self, decodes: list[Request]) -> int:
        """`admission.decode_reserve` of the running decodes (`decodes`, less any preempted
        since), over their columns."""
        running = RequestStatus.RUNNING
        decoding = (decodes if not self._preempted_this_step
                    else [r for r in decodes if r.status is running])
        reserve = None
        try:
            rows = np.fromiter(
                itertools.chain.from_iterable(
                    (len(r.token_ids), r.num_prompt_tokens, r.sampling.max_tokens,
                     len(r.block_table)) for r in decoding),
                dtype=np.int64, count=4 * len(decoding))
            n, prompt, max_tokens, held = rows.reshape(-1, 4).T
            reserve = decode_reserve_columns(n, n - prompt, max_tokens, held,
                                             self.decode_lengths, self.kv.block_size)
        except OverflowError:  # a max_tokens past int64
            pass
        if reserve is None:
            reserve = decode_reserve(decoding, self.decode_lengths, self.kv.block_size)
        return reserve

    def _take_prefixes(self, selected: list[tuple[Request, int]]) -> list[tuple[Request, int]]:
        """Hold the cached prefix of every selected request before any takes new blocks (a
        new block may reuse a cached free one, which must not be a prefix about to be
        taken), each chunk cut to what is left to compute. A prefix found shorter than
        its hint (evicted since) can leave the blocks short: that request and those
        after it stay waiting, their hints as they were. Returns what can be admitted."""
        kv = self.kv
        hints = [(r.prefix_hit, r.num_computed_tokens, r.num_cached_tokens) for r, _ in selected]
        for request, _ in selected:
            kv.claim_prefix(request)
        free = kv.num_free_blocks
        for i, (request, n) in enumerate(selected):
            n = min(n, request.num_uncomputed_tokens)
            free -= kv.blocks_needed(request, n)
            if free < 0:
                for (back, _), hint in zip(selected[i:], hints[i:]):
                    kv.free(back)
                    back.prefix_hit, back.num_computed_tokens, back.num_cached_tokens = hint
                return selected[:i]
            selected[i] = (request, n)
        return selected

    def _make_room(self, request: Request, num_tokens: int, batch: Batch) -> bool:
        """Allocate blocks for `num_tokens` more tokens, preempting lower-priority requests."""
        while not self.kv.allocate(request, num_tokens):
            victim = self._pick_victim(request, batch)
            if victim is None:
                return False
            self._preempt(victim, batch)
        return True

    def _pick_victim(self, request: Request, batch: Batch) -> Request | None:
        """The running request to preempt for `request`, never one already in this batch:
        the newest, or (SGLang) the one that generated fewest tokens, longest prompt first."""
        scheduled = set(map(id, batch.requests()))
        candidates = (c for c in reversed(self.running)
                      if c is not request and id(c) not in scheduled)
        if self.mode.victim == "fewest_generated":
            return min(candidates, key=lambda r: (r.num_output_tokens, -r.num_prompt_tokens),
                       default=None)
        return next(candidates, None)

    def _preempt(self, request: Request, batch: Batch) -> None:
        self.running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.kv.match_prefix(request)  # its own blocks, cached free, until reused
        if self.mode.requeue == "tail":
            self.waiting.append(request)
        else:
            self.waiting.appendleft(request)

    # ---- results ------------------------------------------------------------------------
    def update(self, batch: Batch, sampled: list[int], now: float) -> StepTokens:
        """Advance each chunk's request; append sampled tokens; finish what stops. Returns
        the step's tokens, as columns.

        Runs once per chunk of every step -- once per token of every decode -- so the
        per-chunk work (the stop test too) is written out with its lookups hoisted, and a
        chunk names its request's blocks only when it filled one."""
        request_ids: list[str] = []
        token_ids: list[int] = []
        finished: dict[int, FinishReason] = {}
        logprobs: dict = {}
        add_id, add_token, take = request_ids.append, token_ids.append, iter(sampled).__next__
        running, block_size, eos = RequestStatus.RUNNING, self.kv.block_size, self.eos_token_ids
        name_blocks = self.kv.name_full_blocks if self.kv.prefix_caching else None
        for request, num_tokens, samples in batch.runs():
            token = take() if samples else None
            if request.status is not running:
                continue  # aborted between schedule and update
            computed = request.num_computed_tokens = request.num_computed_tokens + num_tokens
            if name_blocks is not None and computed // block_size > request.num_named_blocks:
                name_blocks(request)  # before it may finish and free them
            if token is None:
                continue
            token_ids_so_far = request.token_ids
            token_ids_so_far.append(token)
            if request.first_token_time is None:
                request.first_token_time = now
            if request.sampled_logprobs is not None:  # moved off the request
                logprobs[len(request_ids)] = request.sampled_logprobs
                request.sampled_logprobs = None
            add_id(request.request_id)
            add_token(token)
            sampling = request.sampling
            if (token in eos and not sampling.ignore_eos) or token in sampling.stop_token_ids:
                reason = FinishReason.STOP
            elif len(token_ids_so_far) >= request.max_total_tokens:
                reason = FinishReason.LENGTH
            else:
                continue
            finished[len(request_ids) - 1] = reason
            self.running.remove(request)
            self._finish(request, reason)
        return StepTokens(request_ids, token_ids, finished, logprobs)

    def _finish(self, request: Request, reason: FinishReason) -> None:
        self.kv.free(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        del self.requests[request.request_id]
        if reason in (FinishReason.STOP, FinishReason.LENGTH):
            self.decode_lengths.observe(request.num_output_tokens)

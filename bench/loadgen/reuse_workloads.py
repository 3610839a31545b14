"""Workloads whose prompts share prefixes, for prefix caching: a shared system prompt, and
multi-turn conversations. Seeded like every workload (bench/loadgen/workloads.py builds them).

* **Shared system prompt** (`system_prompt_len` S, `system_prompts` K): every request's
  prompt is one of K system prompts of S tokens (drawn per request), then its own
  question -- the trace row's prompt, fitted into what the context leaves.
* **Multi-turn** (`turns` T, `think_time`): a conversation is one trace row. Turn t
  (1..T) sends the first t of T near-equal pieces of the row's prompt -- the history so
  far and the new message -- so every turn's prompt starts with the previous one, and
  the last is the row's whole prompt; each turn asks for 1/T of the row's output (the
  row is the whole conversation: its prompt the history, its output every reply).
  Conversations start at `rate`/T per second (Poisson or gamma gaps), and each next
  turn comes an exponential think time (mean `think_time` s) after the one before; a
  run joins them in steady state (`conversation_requests`): it is primed with the
  earlier turns of the conversations in progress when it starts (`warmup` requests,
  never measured), so their next turns find their history cached as they would in
  steady state instead of arriving all cold at once.

A request names its prompt's parts (`bench.loadgen.workload.PromptPart`: equal keys are equal
tokens), so the simulator and a live run send the same structure. `ideal_reuse` says
what share of a workload's prompt tokens an unbounded prefix cache would find: with T
turns about (T - 1) / (T + 1) (2/3 at T = 5, less what block rounding costs); with a
system prompt about S / (S + the mean question).
"""
from __future__ import annotations

import numpy as np

from bench.loadgen.arrivals import arrivals_within
from bench.loadgen.trace_file import TraceRow
from bench.loadgen.workload import PromptPart, WorkloadRequest, fit_lengths, sample_rows

#: Part keys: (kind, ...) -- kinds keep system prompts, questions and history apart.
SYSTEM, QUESTION, HISTORY = 1, 2, 3


def conversation_of(request: WorkloadRequest) -> int | None:
    """The conversation a multi-turn request belongs to (None: not a conversation's turn)."""
    parts = request.prompt_parts
    if parts and parts[0].key[0] == HISTORY:
        return parts[0].key[1]
    return None


def system_prompt_requests(arrivals, rows: list[TraceRow], *, system_prompt_len: int,
                           system_prompts: int, seed: int, length_scale: float,
                           max_prompt_len: int | None, max_model_len: int | None,
                           ) -> list[WorkloadRequest]:
    """One request per arrival: a system prompt, then the row's prompt as its question."""
    room = None if max_model_len is None else max_model_len - system_prompt_len
    if room is not None and room < 2:
        raise ValueError(f"a system prompt of {system_prompt_len} tokens leaves no room in a "
                         f"context of {max_model_len}")
    picks = np.random.default_rng([seed, 5]).integers(0, system_prompts, size=len(arrivals))
    requests = []
    for i, (arrival, row, k) in enumerate(zip(arrivals, rows, picks.tolist())):
        question, output = fit_lengths(row, length_scale, max_prompt_len, room)
        parts = (PromptPart((SYSTEM, k), system_prompt_len), PromptPart((QUESTION, i), question))
        requests.append(WorkloadRequest(i, float(arrival), system_prompt_len + question, output,
                                        prompt_parts=parts))
    return requests


def conversation_requests(rows: list[TraceRow], *, turns: int, think_time: float, rate: float,
                          burstiness: float, num_requests: int | None, duration: float | None,
                          seed: int, length_scale: float, max_prompt_len: int | None,
                          max_model_len: int | None) -> list[WorkloadRequest]:
    """`num_requests` turns (the first to arrive), or every turn arriving within
    `duration` s, of conversations as the module docstring says, in arrival order --
    after the priming turns.

    The run joins the conversations in steady state: they start from `lead_in` seconds
    before time 0 (long enough for nearly every conversation alive at 0 to have begun),
    and the turns from 0 on are the run -- so every stretch of it has the same mix of
    first and later turns, at `rate` turns per second. Before them come the earlier turns
    of the conversations the run joins (`warmup`: they fill the prefix cache, and the
    ruler never measures them; bench/ruler/steady_state.py)."""
    lead_in = 3.0 * (turns - 1) * think_time
    horizon = duration if duration is not None else 1.5 * num_requests / rate + 1.0
    while True:
        made = _turns(rows, turns, think_time, rate, burstiness, seed, lead_in, horizon,
                      length_scale, max_prompt_len, max_model_len)
        if duration is not None or sum(t[0] >= 0 for t in made) >= num_requests:
            break
        horizon *= 2
    made = _primed(made, num_requests)
    first = made[0][0] if made else 0.0  # the run starts with its first arrival
    return [WorkloadRequest(i, arrival - first, sum(p.length for p in parts), output,
                            prompt_parts=parts, warmup=arrival < 0)
            for i, (arrival, _, parts, output) in enumerate(made)]


def _primed(made: list[tuple], num_requests: int | None) -> list[tuple]:
    """The first `num_requests` turns from time 0 on, after the earlier turns (arriving
    before 0) of the conversations they belong to."""
    run = [turn for turn in made if turn[0] >= 0]
    run = run[:num_requests] if num_requests is not None else run
    joined = {conversation for _, conversation, _, _ in run}
    return [turn for turn in made if turn[0] < 0 and turn[1] in joined] + run


def _turns(rows, turns, think_time, rate, burstiness, seed, lead_in, horizon, length_scale,
           max_prompt_len, max_model_len) -> list[tuple]:
    """(arrival, conversation, prompt parts, output length) of every turn before `horizon`
    of the conversations starting in [-lead_in, horizon), in arrival order."""
    starts = arrivals_within(lead_in + horizon, rate / turns, burstiness, seed) - lead_in
    rows = sample_rows(rows, len(starts), seed)
    rng = np.random.default_rng([seed, 6])
    thinks = rng.exponential(think_time, size=(len(starts), turns - 1)) if think_time > 0 \
        else np.zeros((len(starts), turns - 1))
    made = []
    for c, (start, row) in enumerate(zip(starts.tolist(), rows)):
        prompt, output = fit_lengths(row, length_scale, max_prompt_len, max_model_len)
        output = max(1, round(output / turns))  # the row's output is all T replies
        arrival = start
        for t, parts in enumerate(_history(c, prompt, turns)):
            if t:
                arrival += float(thinks[c, t - 1])
            if arrival >= horizon:
                break
            made.append((arrival, c, parts, output))
    made.sort(key=lambda item: (item[0], item[1]))
    return made


def _history(conversation: int, prompt_len: int, turns: int) -> list[tuple[PromptPart, ...]]:
    """Each turn's prompt parts: the first t of `turns` pieces of `prompt_len` tokens (a
    piece may be empty for a prompt shorter than the turns; a turn has at least one)."""
    bounds = [round(prompt_len * t / turns) for t in range(turns + 1)]
    pieces = [PromptPart((HISTORY, conversation, k), bounds[k + 1] - bounds[k])
              for k in range(turns)]
    out = []
    for t in range(1, turns + 1):
        parts = tuple(p for p in pieces[:t] if p.length)
        if parts:
            out.append(parts)
    return out


def ideal_reuse(requests: list[WorkloadRequest], block_size: int) -> float:
    """Share of the run's prompt tokens an unbounded prefix cache of `block_size`-token
    blocks would find (priming requests fill it but are not counted): per request, the
    longest run of leading parts an earlier request's prompt also starts with, in whole
    blocks and never the last token."""
    seen: set[tuple] = set()
    found = total = 0
    for request in requests:
        parts = request.prompt_parts or (PromptPart(("own", request.index), request.prompt_len),)
        shared, tokens = 0, 0
        for k, part in enumerate(parts):
            if tuple(parts[:k + 1]) not in seen:
                break
            tokens += part.length
            shared = tokens
        for k in range(len(parts)):
            seen.add(tuple(parts[:k + 1]))
        if request.warmup:
            continue  # primes the cache; not part of the run
        most = (request.prompt_len - 1) // block_size * block_size
        found += min(shared // block_size * block_size, most)
        total += request.prompt_len
    return found / total if total else 0.0

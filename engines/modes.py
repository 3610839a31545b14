"""Scheduling modes: the knobs that make one scheduler behave as vLLM, Sarathi-Serve,
or one of Ascendra's two instance kinds.

A mode is data: which batching rule, and which of the policies in `policies/` it
applies (value ordering, offloads, elastic batch, compute budget). The scheduler
calls those policy functions; no mode has a scheduler of its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ipc.messages import Role
from policies.admission import LP_MAX_BATCH

#: HP's batch is bounded by KV (elastic), not by a seat count: a generous cap.
HP_MAX_BATCH = 1024


@dataclass(frozen=True)
class Mode:
    name: str
    #: True: admit waiting prompts first and let decodes wait (vLLM V0, SGLang). False: every
    #: running decode first, then prefill chunks in what is left of the token budget
    #: (Sarathi-Serve, vLLM V1, LP, HP).
    prefill_first: bool
    #: Split prompts into chunks to fit the token budget (else a prompt runs whole, and a
    #: prefill-first step may exceed the budget to fit the longest prompt).
    chunked_prefill: bool
    #: Order waiting prompts by the configured value function (else arrival order).
    by_value: bool = False
    #: ... or by this value function whatever the configuration says.
    value_function: str | None = None
    #: Hand waiting requests that will miss their deadline here to an HP instance.
    offloads: bool = False
    #: Admit prefills only while free KV covers what running decodes will still need.
    elastic_batch: bool = False
    #: Keep a step's predicted time within the running requests' TBT SLO.
    compute_budget: bool = False
    #: With compute_budget: a prompt that meets its TTFT only if its whole prefill runs in
    #: the next step gets that step, the decodes' TBT budget notwithstanding
    #: (`tbt_budget.whole_prefill_pays`): an HP's job is the rescue, and an LP that chunks a
    #: long prompt beside its decodes would see it late.
    whole_prefill_for_ttft: bool = False
    #: With by_value: waiting requests whose TTFT target is already lost go behind the
    #: others (`order_by_value(demote_unreachable=...)`): they still run, but make no one late.
    demote_unreachable: bool = False
    #: max_num_seqs when the config leaves it unset (capped by the token budget in
    #: decode-first modes, where every running decode must fit in one step).
    default_max_num_seqs: int = 256
    #: Share of the KV cache admission leaves free (vLLM V0's watermark, 1 %): a prompt is
    #: admitted only if this many blocks stay free after it.
    admission_watermark: float = 0.0
    #: False: a step that preempted a running request admits no waiting one (vLLM V1).
    admit_after_preempt: bool = True
    #: Admission keeps free KV for the output running requests are expected to write,
    #: by SGLang's new-token ratio (policies/output_reserve.py).
    reserve_output: bool = False
    #: Which running request is preempted when KV runs out: "newest" (vLLM) or
    #: "fewest_generated" (SGLang's retraction: fewest output tokens, longest prompt first).
    victim: Literal["newest", "fewest_generated"] = "newest"
    #: Where a preempted request waits: "head" of the queue (vLLM) or its "tail" (SGLang).
    requeue: Literal["head", "tail"] = "head"

    @property
    def uses_perf_model(self) -> bool:
        """Its decisions need predicted times (value order, offloads, compute budget)."""
        return self.by_value or self.offloads or self.compute_budget


SARATHI = Mode("sarathi", prefill_first=False, chunked_prefill=True)
# The baselines as their systems schedule, read from their code (docs/baselines.md).
#: vLLM V0 (chunked prefill off): whole prompts first, a step is prefills or decodes; a
#: prompt is admitted only while 1 % of the cache stays free; preempted requests recompute
#: from the head of the queue.
VLLM_V0 = Mode("vllm-v0", prefill_first=True, chunked_prefill=False,
               admission_watermark=0.01)
#: vLLM V1: running requests first, then waiting ones, chunked, in one token budget; a
#: step that preempted admits nothing new.
VLLM_V1 = Mode("vllm-v1", prefill_first=False, chunked_prefill=True, admit_after_preempt=False)
#: SGLang: a step is prefills (chunked) or decodes; admission reserves running requests'
#: expected output; a decode step short of KV retracts the requests that generated least
#: to the tail of the queue.
SGLANG = Mode("sglang", prefill_first=True, chunked_prefill=True, reserve_output=True,
              victim="fewest_generated", requeue="tail", default_max_num_seqs=2048)
LP = Mode("lp", prefill_first=False, chunked_prefill=True, by_value=True, offloads=True,
          elastic_batch=True, compute_budget=True, whole_prefill_for_ttft=True,
          demote_unreachable=True, default_max_num_seqs=LP_MAX_BATCH)
HP = Mode("hp", prefill_first=False, chunked_prefill=True, by_value=True, value_function="edf",
          elastic_batch=True, compute_budget=True, whole_prefill_for_ttft=True, demote_unreachable=True,
          default_max_num_seqs=HP_MAX_BATCH)

#: DistServe's P/D layouts (`<n>P<m>D`): a prefill instance batches prompts as Sarathi-Serve
#: does and hands each request off at its first token (engines/handoff.py); a decode
#: instance runs the decodes it is handed (and recomputes a prompt only when it had no
#: room for the KV that came with it).
PREFILL = Mode("prefill", prefill_first=False, chunked_prefill=True)
DECODE = Mode("decode", prefill_first=False, chunked_prefill=True)

MODES: dict[str, Mode] = {m.name: m for m in (SARATHI, VLLM_V0, VLLM_V1, SGLANG, LP, HP,
                                               PREFILL, DECODE)}
#: The baselines' modes, as layouts `<n>x<mode>` run them.
BASELINES = (SARATHI.name, VLLM_V0.name, VLLM_V1.name, SGLANG.name)
#: Old names still accepted: `vllm` was vLLM V0 without its watermark, which let a
#: prefill-first instance admit, preempt and re-admit in a loop (docs/baselines.md).
ALIASES = {"vllm": VLLM_V0.name}


def role_of_mode(name: str) -> Role:
    """What the controller routes an instance of this mode as: LP, HP, a P/D layout's
    prefill or decode instance, or a baseline's peer."""
    return {LP.name: Role.LP, HP.name: Role.HP, PREFILL.name: Role.PREFILL,
            DECODE.name: Role.DECODE}.get(name, Role.PEER)


def get_mode(name: str) -> Mode:
    try:
        return MODES[ALIASES.get(name, name)]
    except KeyError:
        raise ValueError(f"unknown scheduler mode {name!r}; choose one of {sorted(MODES)}") from None

"""How a model's default SLOs scale with its size: the one source of the factor.

The default SLOs (TTFT 1 s, mean TBT 0.15 s; the mixed-slo classes 0.5 / 2 / 30 s) are the
Ascendra paper's ShareGPT settings for a model on one GPU (Llama-3-8B on an A100). A
larger model cannot meet an 8B's SLOs on any hardware it fits: a Llama-3-70B prefills a
2,048-token prompt in 0.26-0.72 s at tp 8-2 on A100s, against 0.16 s for the 8B, so a
1 s TTFT is 6.3 of the 8B's prefills but 1.4-3.9 of the 70B's.

Serving papers set SLOs per model from the model's own isolated latency on its hardware
(Sarathi-Serve: TBT SLOs a fixed multiple of the model's decode iteration time at its
deployment; DistServe: TTFT/TPOT set per model, looser for OPT-66B than for OPT-13B). The
same rule here: a model's SLOs are the default SLOs times

    ttft = one 2,048-token prefill      of the model / of Llama-3-8B on one A100,
    tbt  = one decode at context 2,048  of the model / of Llama-3-8B on one A100,

each at least 1, the model timed alone at its *reference degree*: the smallest tensor-
parallel degree at which one instance holds a batch -- KV for 64 sequences of 2,048 tokens
(a 70B on 80 GB A100s: tp 4; at tp 2 the weights fit but only 21k tokens of KV do). The
scale is the model's, not the deployment's: every degree of one model (`@tp2`..`@tp8`)
is held to the same SLOs, so degrees are compared on one target.

A model that fits one GPU keeps the paper's SLOs (scale 1): the one-GPU studies were set
on them, and their records stay what they were. A profile file `ascendra profile`
measured also keeps scale 1 (it has no reference degree to time).
"""
from __future__ import annotations

import msgspec

from policies.batch_shape import BatchShape

#: The profile the default SLOs were set for.
REFERENCE_PROFILE = "a100-llama3-8b"
#: The prompt and decode context the isolated latencies are timed at.
REFERENCE_TOKENS = 2048
#: A reference degree's instance holds KV for this many sequences of REFERENCE_TOKENS.
BATCH_SEQUENCES = 64


class SloScale(msgspec.Struct, frozen=True, kw_only=True):
    """Factors on the default SLOs, and why (printed with every run's configuration)."""
    ttft: float = 1.0
    tbt: float = 1.0
    #: how the factors were found ("" for the defaults)
    basis: str = ""

    def describe(self) -> str:
        """The scale as a line of a run's output."""
        return (f"SLO scale: TTFT x{self.ttft:g}, TBT x{self.tbt:g} "
                f"({self.basis or 'the default SLOs'})")


def isolated_seconds(profile) -> tuple[float, float]:
    """(one REFERENCE_TOKENS prefill, one decode at that context), seconds, alone."""
    prefill = profile.step_time(BatchShape([REFERENCE_TOKENS], [0]))
    decode = profile.step_time(BatchShape(decode_context=[REFERENCE_TOKENS]))
    return prefill, decode


def reference_degree(base) -> int | None:
    """The smallest degree of profile `base` (at tp 1) whose instance holds a batch; 1 when
    the model fits one GPU; None when no degree does."""
    from engines.executors.profiles.registry import TP_DEGREES
    for k in TP_DEGREES:
        try:
            capacity = base.at_tp(k).kv_capacity_tokens
        except ValueError:
            continue
        if k == 1 or capacity >= BATCH_SEQUENCES * REFERENCE_TOKENS:
            return k
    return None


def slo_scale(profile_name: str) -> SloScale:
    """The SLO scale of the model profile `profile_name` names (any degree of it)."""
    from engines.executors.profiles.registry import PROFILES, get_profile
    base = PROFILES.get(profile_name.strip().partition("@tp")[0])
    if base is None:  # a measured profile file
        return SloScale()
    degree = reference_degree(base)
    if degree in (1, None):
        return SloScale()
    prefill, decode = isolated_seconds(base.at_tp(degree))
    ref_prefill, ref_decode = isolated_seconds(get_profile(REFERENCE_PROFILE))
    ttft = max(1.0, round(prefill / ref_prefill, 2))
    tbt = max(1.0, round(decode / ref_decode, 2))
    return SloScale(ttft=ttft, tbt=tbt, basis=(
        f"{base.name} at tp {degree} alone: {REFERENCE_TOKENS}-token prefill "
        f"{prefill * 1e3:.0f} ms, decode {decode * 1e3:.1f} ms; {REFERENCE_PROFILE}: "
        f"{ref_prefill * 1e3:.0f} ms, {ref_decode * 1e3:.1f} ms"))


def parse_slo_scale(text: str, profile_name: str) -> SloScale:
    """`--slo-scale`: "auto" (the model's, `slo_scale`), X (both factors) or X,Y (TTFT,
    TBT); ValueError naming the flag otherwise."""
    if text.strip() == "auto":
        return slo_scale(profile_name)
    try:
        factors = [float(x) for x in text.split(",")]
    except ValueError:
        factors = []
    if len(factors) not in (1, 2) or min(factors) <= 0:
        raise ValueError(f"--slo-scale {text!r}: give auto, X or TTFT,TBT (numbers > 0)")
    ttft, tbt = factors if len(factors) == 2 else factors * 2
    return SloScale(ttft=ttft, tbt=tbt, basis="--slo-scale")

"""GPU latency profiles against every published number they can be compared with.

For each reference point in ../shared/profiles/README.md: the summed per-layer op times
(per profile and token count), the A100 Llama-3-8B attn_decode spot values, the 64-token
prefill chunk range, and the iteration-level numbers for one of our models (TensorRT-LLM's
LLaMA-7B A100 FP16 first-token latency and peak throughput). Prints predicted vs published
and their ratio; figures only, no pass/fail.

    python -m bench.profile_check
"""
from __future__ import annotations

import argparse

from bench import profile_refs as refs
from engines.executors.profiles import PROFILES, GpuProfile
from engines.executors.profiles.attention import decode_seconds, prefill_seconds
from policies.batch_shape import BatchShape

#: published numbers that are not for one of our model/GPU set-ups, and why
NOT_COMPARED = (
    ("sarathi_osdi24/*.csv", "Yi-34B-200K at TP=2 on A100 PCIe pairs: not one of our models"),
    ("splitwise_sim/perf_model.csv", "Llama-2-70B (TP 2-8) and BLOOM-176B (TP 8) only"),
    ("TensorRT-LLM H100 7 / 36 ms", "FP8 weights and activations; our profiles are bf16/fp16"),
    ("DistServe profiles", "OPT-13B/66B fitted coefficients, not copied"),
)


def row(label: str, published: float, predicted: float, unit: str = "ms") -> None:
    print(f"  {label:<34} published {published:10.3f} {unit:<5} predicted {predicted:10.3f}"
          f" {unit:<5} ratio {predicted / published:5.2f}")


def check_summed_ops(text: str) -> None:
    print("Sum of the 9 per-layer ops x layers (linear part of a step, ms)")
    for name, table in refs.summed_ops(text).items():
        profile = PROFILES[name]
        for tokens, ms in table.items():
            predicted = profile.breakdown(BatchShape.prefill_only(tokens)).linear * 1e3
            row(f"{name} {tokens} tokens", ms, predicted)


def check_attention(text: str) -> None:
    profile = PROFILES["a100-llama3-8b"]
    model, hw, cal = profile.model, profile.hardware, profile.attention
    print("attn_decode, A100 Llama-3-8B, ms per layer")
    for context, batch, ms in refs.decode_spots(text):
        predicted = decode_seconds([context] * batch, model, hw, cal) * 1e3
        row(f"ctx {context} x batch {batch}", ms, predicted)
    print("attn_prefill of one chunk, A100 Llama-3-8B, ms per layer")
    chunk, kv_lo, kv_hi, ms_lo, ms_hi = refs.prefill_chunk_range(text)
    for kv, ms in ((kv_lo, ms_lo), (kv_hi, ms_hi)):
        predicted = prefill_seconds([chunk], [kv], model, hw, cal) * 1e3
        row(f"{chunk}-token chunk after kv {kv}", ms, predicted)


def static_batch_seconds(profile: GpuProfile, batch: int, prompt: int, output: int,
                         step_tokens: int = 4096) -> float:
    """A static batch: prompts packed into steps of `step_tokens` (chunked where needed),
    then output-1 decode steps (each prefill's last chunk samples the first token)."""
    total, done = 0.0, [0] * batch
    current = 0
    while current < batch:
        chunks, sampling, budget = [], 0, step_tokens
        while budget and current < batch:
            take = min(budget, prompt - done[current])
            chunks.append((take, done[current]))
            done[current] += take
            budget -= take
            if done[current] == prompt:
                sampling += 1
                current += 1
        total += profile.step_time(BatchShape.of(prefills=chunks), num_sampling=sampling)
    for k in range(1, output):
        total += profile.step_time(BatchShape.of(decodes=[prompt + k] * batch))
    return total


def check_iterations(text: str) -> None:
    profile = PROFILES["a100-llama2-7b"]
    print("TensorRT-LLM LLaMA-7B, A100 FP16 (a100-llama2-7b; another framework's kernels)")
    for tokens, ms in refs.trt_first_token_a100(text):
        predicted = profile.step_time(BatchShape.prefill_only(tokens)) * 1e3
        row(f"first token, batch 1, {tokens} in", ms, predicted)
    for tok_s, batch, prompt, output in refs.trt_throughput_a100(text):
        seconds = static_batch_seconds(profile, batch, prompt, output)
        kv_need = batch * (prompt + output)
        row(f"bs {batch} {prompt} in/{output} out (1)", tok_s, batch * output / seconds, "tok/s")
        print(f"  {'':<34} KV at the end {kv_need} tokens, capacity "
              f"{profile.kv_capacity_tokens} tokens")
    print("  (1) approximate: one static batch, prompts in 4096-token steps, then decodes")


def show_profiles() -> None:
    print("Profiles (80 GiB, 0.9 utilisation, bf16)")
    for name, p in PROFILES.items():
        print(f"  {name:<16} weights {p.weight_bytes / 2**30:5.1f} GiB  KV "
              f"{p.kv_bytes_per_token // 1024:4d} KiB/token  capacity {p.kv_capacity_tokens:7d}"
              f" tokens = {p.num_kv_blocks(16):6d} blocks of 16  ({p.description})")


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    text = refs.readme_text()
    show_profiles()
    for section in (check_summed_ops, check_attention, check_iterations):
        print()
        section(text)
    print("\nNot compared:")
    for what, why in NOT_COMPARED:
        print(f"  {what:<30} {why}")


if __name__ == "__main__":
    main()

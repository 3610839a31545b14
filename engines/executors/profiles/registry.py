"""The named GPU profiles: `profile:<name>` in a latency spec, `--profile <name>` on a CLI;
or, in their place, a profile file `ascendra profile` measured (measured.py).

Model shapes are the Hugging Face configs' sizes. Each profile takes its per-layer op
times from the Vidur file of the same per-layer shape (see tables/README.md):
Mistral-7B shares Llama-3-8B's layers (only the vocabulary differs); Qwen-14B (hidden 5120,
40 MHA heads, FFN 13696, 40 layers, vocab 152064; not verified from a stored config) is
approximated by internlm-20b's layers (5120, 40/40 heads, FFN 13824) times 40.
"""
from __future__ import annotations

from engines.executors.profiles.measured import MeasuredProfile, is_profile_file, load_measured
from engines.executors.profiles.profile import GpuProfile
from policies.perf.hardware_spec import HARDWARE
from policies.perf.model_shape import ModelShape

LLAMA3_8B = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                       intermediate=14336, vocab=128256)
MISTRAL_7B = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                        intermediate=14336, vocab=32000)
LLAMA2_7B = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128,
                       intermediate=11008, vocab=32000)
QWEN_14B = ModelShape(layers=40, hidden=5120, heads=40, kv_heads=40, head_dim=128,
                      intermediate=13696, vocab=152064)

_LLAMA3_OPS = "a100_Meta-Llama-3-8B_mlp.csv"

PROFILES: dict[str, GpuProfile] = {p.name: p for p in (
    GpuProfile("a100-llama3-8b", _LLAMA3_OPS, LLAMA3_8B, HARDWARE["a100"],
               "Llama-3-8B on one A100-80G (Vidur A100 Llama-3-8B ops)"),
    GpuProfile("a100-mistral-7b", _LLAMA3_OPS, MISTRAL_7B, HARDWARE["a100"],
               "Mistral-7B on one A100-80G (Llama-3-8B's per-layer ops, vocab 32000)"),
    GpuProfile("a100-llama2-7b", "a100_Llama-2-7b-hf_mlp.csv", LLAMA2_7B, HARDWARE["a100"],
               "Llama-2-7B on one A100-80G (Vidur A100 Llama-2-7B ops)"),
    GpuProfile("h100-llama2-7b", "h100_Llama-2-7b-hf_mlp.csv", LLAMA2_7B, HARDWARE["h100"],
               "Llama-2-7B on one H100-80G (Vidur H100 Llama-2-7B ops)"),
    GpuProfile("a100-qwen14b", "a100_internlm-20b_mlp.csv", QWEN_14B, HARDWARE["a100"],
               "Qwen-14B on one A100-80G (internlm-20b's per-layer ops x 40 layers)"),
)}


def profile_names() -> list[str]:
    return sorted(PROFILES)


def get_profile(name: str) -> GpuProfile | MeasuredProfile:
    """The named profile, or the measured one in the file `name` names; ValueError listing
    the names when there is none (or saying what is wrong with the file)."""
    if name.strip() not in PROFILES and is_profile_file(name):
        return load_measured(name)
    profile = PROFILES.get(name.strip())
    if profile is None:
        raise ValueError(f"unknown GPU profile {name!r}; choose one of {profile_names()} "
                         f"or a file `ascendra profile` wrote")
    return profile


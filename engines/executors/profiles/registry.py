"""The named GPU profiles: `profile:<name>` in a latency spec, `--profile <name>` on a CLI;
or, in their place, a profile file `ascendra profile` measured (measured.py).

Model shapes are the Hugging Face configs' sizes. Each profile takes its per-layer op
times from the Vidur file of the same per-layer shape (see tables/README.md):
Mistral-7B shares Llama-3-8B's layers (only the vocabulary differs); Qwen-14B (hidden 5120,
40 MHA heads, FFN 13696, 40 layers, vocab 152064; not verified from a stored config) is
approximated by internlm-20b's layers (5120, 40/40 heads, FFN 13824) times 40.

The 70B profiles have their own Vidur files (Llama-3-70B: 8192, 64/8 heads, FFN 28672, 80
layers, vocab 128256; Llama-2-70B the same layers, vocab 32000). Every profile with an
all-reduce file runs at a tensor-parallel degree of 2, 4 or 8 as `<name>@tp<k>`
(GpuProfile.at_tp); a 70B model fits no single 80 GB GPU, so its plain name (tp 1) is
refused where capacity is asked for.
"""
from __future__ import annotations

from engines.executors.profiles.measured import MeasuredProfile, is_profile_file, load_measured
from engines.executors.profiles.profile import GpuProfile, tp_name
from engines.perf.hardware_spec import HARDWARE
from engines.perf.model_shape import ModelShape

LLAMA3_8B = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                       intermediate=14336, vocab=128256)
MISTRAL_7B = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                        intermediate=14336, vocab=32000)
LLAMA2_7B = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128,
                       intermediate=11008, vocab=32000)
QWEN_14B = ModelShape(layers=40, hidden=5120, heads=40, kv_heads=40, head_dim=128,
                      intermediate=13696, vocab=152064)

LLAMA3_70B = ModelShape(layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
                        intermediate=28672, vocab=128256)
LLAMA2_70B = ModelShape(layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
                        intermediate=28672, vocab=32000)

_LLAMA3_OPS = "a100_Meta-Llama-3-8B_mlp.csv"
#: Vidur's NCCL all-reduce profiles of one DGX node (network/<gpu>_dgx/all_reduce.csv)
A100_ALL_REDUCE = "a100_dgx_all_reduce.csv"
H100_ALL_REDUCE = "h100_dgx_all_reduce.csv"
#: The degrees Vidur measured the compute ops at.
TP_DEGREES = (1, 2, 4, 8)

PROFILES: dict[str, GpuProfile] = {p.name: p for p in (
    GpuProfile("a100-llama3-8b", _LLAMA3_OPS, LLAMA3_8B, HARDWARE["a100"],
               "Llama-3-8B on one A100-80G (Vidur A100 Llama-3-8B ops)",
               network_file=A100_ALL_REDUCE),
    GpuProfile("a100-mistral-7b", _LLAMA3_OPS, MISTRAL_7B, HARDWARE["a100"],
               "Mistral-7B on one A100-80G (Llama-3-8B's per-layer ops, vocab 32000)"),
    GpuProfile("a100-llama2-7b", "a100_Llama-2-7b-hf_mlp.csv", LLAMA2_7B, HARDWARE["a100"],
               "Llama-2-7B on one A100-80G (Vidur A100 Llama-2-7B ops)",
               network_file=A100_ALL_REDUCE),
    GpuProfile("h100-llama2-7b", "h100_Llama-2-7b-hf_mlp.csv", LLAMA2_7B, HARDWARE["h100"],
               "Llama-2-7B on one H100-80G (Vidur H100 Llama-2-7B ops)",
               network_file=H100_ALL_REDUCE),
    GpuProfile("a100-llama3-70b", "a100_Meta-Llama-3-70B_mlp.csv", LLAMA3_70B, HARDWARE["a100"],
               "Llama-3-70B on A100-80Gs of one DGX node (Vidur A100 Llama-3-70B ops; "
               "use @tp2, @tp4 or @tp8)", network_file=A100_ALL_REDUCE),
    GpuProfile("a100-llama2-70b", "a100_Llama-2-70b-hf_mlp.csv", LLAMA2_70B, HARDWARE["a100"],
               "Llama-2-70B on A100-80Gs of one DGX node (Vidur A100 Llama-2-70B ops; "
               "use @tp2, @tp4 or @tp8)", network_file=A100_ALL_REDUCE),
    GpuProfile("h100-llama2-70b", "h100_Llama-2-70b-hf_mlp.csv", LLAMA2_70B, HARDWARE["h100"],
               "Llama-2-70B on H100-80Gs of one DGX node (Vidur H100 Llama-2-70B ops; "
               "use @tp2, @tp4 or @tp8)", network_file=H100_ALL_REDUCE),
    GpuProfile("a100-qwen14b", "a100_internlm-20b_mlp.csv", QWEN_14B, HARDWARE["a100"],
               "Qwen-14B on one A100-80G (internlm-20b's per-layer ops x 40 layers)"),
)}


def profile_names() -> list[str]:
    return sorted(PROFILES)


def get_profile(name: str, tp: int = 1) -> GpuProfile | MeasuredProfile:
    """The named profile (`<name>@tp<k>`: over k GPUs), at degree `tp` when more than 1, or
    the measured one in the file `name` names (measured at its own degree); ValueError
    listing the names when there is none (or saying what is wrong with the file)."""
    base, _, degree = name.strip().partition("@tp")
    if base not in PROFILES and is_profile_file(name):
        measured = load_measured(name)
        if tp > 1 and measured.data.tp != tp:
            raise ValueError(f"tp: profile file {name!r} was measured at tp {measured.data.tp}, "
                             f"tp asks for {tp}")
        return measured
    profile = PROFILES.get(base)
    if profile is None or (degree and not degree.isdigit()):
        raise ValueError(f"unknown GPU profile {name!r}; choose one of {profile_names()} "
                         f"(over k GPUs: <name>@tp<k>, k in {TP_DEGREES[1:]}) or a file "
                         f"`ascendra profile` wrote")
    if degree and tp > 1 and int(degree) != tp:
        raise ValueError(f"tp: profile {name!r} is at tp {degree}, tp asks for {tp}")
    return profile.at_tp(int(degree) if degree else tp)


def with_tp(name: str, tp: int) -> str:
    """`name` at degree `tp` (a name with @tp already, or a profile file: itself)."""
    if "@tp" in name or tp == 1 or (name.strip() not in PROFILES and is_profile_file(name)):
        return name
    return tp_name(name, tp)

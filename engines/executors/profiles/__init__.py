"""GPU latency profiles for the sim executor, from third-party profiling data.

`PROFILES["a100-llama3-8b"].step_time(shape)` predicts the seconds of one engine step on
that GPU for that model; `profile_latency(name)` wraps it as a latency function
(`make_latency("profile:<name>")`). Each profile also carries the ModelShape and
HardwareSpec the online performance model can be built on, and its KV capacity (vLLM's
budget after weights, activation peak and CUDA graphs: capacity.py, memory_reserve.py).
The operator tables are packaged (tables/, derived from third-party data by derive_tables.py);
ASCENDRA_PROFILES can point at a folder of the raw files instead.
"""
from engines.executors.profiles.batch_latency import profile_latency
from engines.executors.profiles.data import ENV_VAR, raw_profiles_dir
from engines.executors.profiles.profile import GpuProfile
from engines.executors.profiles.registry import PROFILES, get_profile, profile_names

__all__ = ["ENV_VAR", "PROFILES", "GpuProfile", "get_profile", "profile_latency",
           "profile_names", "raw_profiles_dir"]

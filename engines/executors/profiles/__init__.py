"""GPU latency profiles for the sim executor, from third-party profiling data.

`PROFILES["a100-llama3-8b"].step_time(shape)` predicts the seconds of one engine step on
that GPU for that model; `profile_latency(name)` wraps it as a latency function
(`make_latency("profile:<name>")`). Each profile also carries the ModelShape and
HardwareSpec the online performance model can be built on, and its KV capacity.
The data is read at run time from ../shared/profiles (env ASCENDRA_PROFILES).
"""
from engines.executors.profiles.attention import FLASHINFER_A100, AttentionCalibration
from engines.executors.profiles.batch_latency import profile_latency
from engines.executors.profiles.data import ENV_VAR, profiles_dir
from engines.executors.profiles.profile import FRAMEWORK_OVERHEAD_S, GpuProfile, StepTime
from engines.executors.profiles.registry import PROFILES, get_profile, profile_names

__all__ = ["ENV_VAR", "FLASHINFER_A100", "FRAMEWORK_OVERHEAD_S", "PROFILES",
           "AttentionCalibration", "GpuProfile", "StepTime", "get_profile", "profile_latency",
           "profile_names", "profiles_dir"]

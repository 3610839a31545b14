"""Profile files joined and scaled: several looks at one machine as one file, and one
file as the same machine at another speed.

A profile is a look at the machine in the minutes it was timed. Where the machine's
speed wanders (a shared VM's core: docs/measured_profiles.md measured the same batches
0.85-1.05x as fast from one minute to the next), one look is as far off as the machine
moved since. `join` makes one file of several timings of the same grid on the same
executor -- each step keeps every file's repetitions, so its median spans all their
minutes, and the host samples and step overheads are all of theirs (`ascendra profile
--join A B --out C`). `scale` multiplies every step's time by a factor: the same executor
running `factor` times as slow, as a live run's step log measures it against the file's
fit (bench/profiling/step_log_study.py `speed`).
"""
from __future__ import annotations

import msgspec

from engines.executors.profiles.measured import ProfileFile

#: What the files joined must share: the executor they timed and the grid's settings.
SAME_EXECUTOR = ("device", "torch_version", "model", "dtype", "tp", "block_size",
                 "num_kv_blocks", "max_model_len")


def join(files: list[tuple[str, ProfileFile]]) -> ProfileFile:
    """One file of several `(name, file)` timings of the same grid on the same executor:
    each step's seconds are every file's, the host samples and overheads all of theirs
    (None if any file has none), the date the first's. ValueError naming the file and what differs."""
    if not files:
        raise ValueError("join needs at least one profile file")
    first_name, first = files[0]
    shapes = [(s.kind, s.prefills, s.decodes) for s in first.steps]
    for name, other in files[1:]:
        for field in SAME_EXECUTOR:
            if getattr(other, field) != getattr(first, field):
                raise ValueError(f"profile {name!r} has another {field} than {first_name!r} "
                                 f"({getattr(other, field)!r}, not {getattr(first, field)!r})")
        if [(s.kind, s.prefills, s.decodes) for s in other.steps] != shapes:
            raise ValueError(f"profile {name!r} timed another grid than {first_name!r} "
                             f"(the same --chunk-size, --max-num-seqs, --max-model-len, "
                             f"--num-kv-blocks and --quick make the same grid)")
    steps = [msgspec.structs.replace(step, seconds=[t for _, f in files
                                                    for t in f.steps[i].seconds])
             for i, step in enumerate(first.steps)]
    return msgspec.structs.replace(first, steps=steps, host=_all(f.host for _, f in files),
                                   overhead=_all(f.overhead for _, f in files),
                                   repeats=sum(f.repeats for _, f in files))


def _all(lists) -> list | None:
    """Every file's entries, one list; None when a file has none (not timed)."""
    lists = list(lists)
    return None if any(x is None for x in lists) else [e for x in lists for e in x]


def scale(profile: ProfileFile, factor: float) -> ProfileFile:
    """`profile`'s executor running `factor` times as slow: every step's seconds
    multiplied by `factor` (> 0). The daemon's path (host samples, overheads) is kept as
    timed -- a run's speed is measured over the executor's calls alone -- and its costs
    are read again against the new fit, as for any file."""
    if not factor > 0:
        raise ValueError(f"a profile's speed factor must be > 0, got {factor}")
    return msgspec.structs.replace(profile, steps=[
        msgspec.structs.replace(s, seconds=[factor * t for t in s.seconds])
        for s in profile.steps])

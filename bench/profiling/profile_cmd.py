"""`ascendra profile`: time this machine's executor over a grid of steps and write a
profile file that `simulate`, `capacity` and `plan` take as `--profile FILE`; or
(`--compare FILE [OTHER]`) set a file's measured steps beside its fit and beside a
built-in profile or another file.

    ascendra profile --model DIR --device cpu --out tiny-cpu.json [--quick] [--no-host]
    ascendra profile --compare tiny-cpu.json [a100-llama3-8b | other.json]
    ascendra profile --join morning.json noon.json --out day.json

The grid is engines/executors/profiles/profile_grid.py's; it is run `--repeats` times
over, each pass after one untimed warm-up (engines/calibration.py `measure`, the
batches a daemon's instance times at start); the file format is engines/executors/profiles/measured.py's.
Then (unless `--no-host`) the daemon's own path is timed live on the same executor
(bench/profiling/host_timing.py): what the simulator must add per request and per step.
It lives in bench/ (not beside `serve` in daemon/) because that phase starts a daemon
and drives it with `ascendra bench`'s client.
"""
from __future__ import annotations

import argparse
import datetime
import platform
import sys

import msgspec

from engines.executors.profiles.measured import (
    PROFILE_FORMAT, ProfileFile, TimedStep, check_model, load_measured, read_profile,
    write_profile,
)
from bench.launch.daemon_launcher import DaemonStartError
from bench.profiling import host_timing
from engines.executors.executor_config import DEFAULT_TORCH_THREADS
from engines.executors.profiles.registry import get_profile
from engines.scheduler_config import SchedulerConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    scheduler = SchedulerConfig()
    p.add_argument("--model", help="Hugging Face model folder (default: the built-in tiny model)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    p.add_argument("--out", help="the profile file to write (JSON)")
    p.add_argument("--quick", action="store_true", help="a coarser grid, fewer repetitions")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed runs of each step (default 3; --quick 2)")
    p.add_argument("--chunk-size", type=int, default=scheduler.chunk_size,
                   help="largest step in tokens: the scheduler's token budget (default: "
                        "%(default)s)")
    p.add_argument("--max-num-seqs", type=int, default=scheduler.resolved_max_num_seqs(),
                   help="largest decode batch (default: %(default)s)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="longest context to time (default: the model's, as the KV cache "
                        "allows); give the length you serve: one fit over longer contexts "
                        "prices the shorter steps worse")
    p.add_argument("--num-kv-blocks", type=int, default=None,
                   help="KV cache size in blocks (default: what the device's memory holds)")
    p.add_argument("--block-size", type=int, default=16, help="KV block size (default 16)")
    p.add_argument("--torch-threads", type=int, default=DEFAULT_TORCH_THREADS,
                   help="torch threads of the profiled executor and of the live phase's "
                        "instance (serve's instances.torch_threads); 0 = torch's default "
                        "(default %(default)s)")
    p.add_argument("--no-host", action="store_true",
                   help="skip the live phase (a daemon on this executor, timed through its "
                        "HTTP path): the file then holds no host costs")
    p.add_argument("--join", nargs="+", metavar="FILE",
                   help="write --out as one file of these timings of the same grid on the "
                        "same executor, each step with all their repetitions (a machine "
                        "whose speed wanders, looked at over several minutes)")
    p.add_argument("--compare", nargs="+", metavar="FILE",
                   help="FILE [OTHER]: FILE's measured steps beside its fit, and beside OTHER "
                        "(a built-in profile name or another file) if given")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.compare:
            return compare(args.compare, args.model)
        if not args.out:
            raise ValueError("--out FILE is needed (or --compare FILE)")
        if args.join:
            return join_files(args.join, args.out)
        if args.tp < 1:
            raise ValueError(f"--tp must be >= 1, got {args.tp}")
        if args.torch_threads < 0:
            raise ValueError(f"--torch-threads must be >= 0, got {args.torch_threads}")
        return measure_profile(args)
    except (ValueError, DaemonStartError) as exc:
        print(f"ascendra profile: error: {exc}", file=sys.stderr)
        return 2


def measure_profile(args: argparse.Namespace) -> int:
    from engines.executors.build import build_executor
    from engines.executors.executor_config import ExecutorConfig
    from engines.models.builtin import builtin_tiny_model_dir

    model_dir = args.model or builtin_tiny_model_dir()
    # the instance's own executor: at --tp K, rank 0 driving K-1 rank processes
    executor = build_executor(ExecutorConfig(
        kind="torch", model_dir=str(model_dir), block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks, device=args.device or "",
        max_model_len=args.max_model_len, tp=args.tp, torch_threads=args.torch_threads))
    try:
        profile = _measure(args, executor, model_dir)
        device = executor.device.type
    finally:
        if executor.ranks is not None:
            executor.ranks.stop()
    del executor  # its weights and KV cache: the live phase's daemon needs the device
    _release_device()
    if not args.no_host:
        samples, overhead = _time_host(args, profile, device)
        profile = msgspec.structs.replace(profile, host=samples, overhead=overhead)
    write_profile(args.out, profile)
    fitted = load_measured(args.out)
    print(f"wrote {args.out}: {len(profile.steps)} steps x {profile.repeats}, "
          f"{profile.device}; the step-time fit is off by {fitted.fit_mape:.1%} on average")
    if fitted.host is not None:
        cost = fitted.host
        print(f"host costs (the daemon's path beyond the fitted steps): "
              f"{cost.request_s * 1e3:.2f} ms a request, {cost.step_s * 1e3:.3f} ms a step "
              f"+ {cost.step_per_seq_s * 1e6:.1f} us a sequence")
    return 0


def join_files(paths: list[str], out: str) -> int:
    """`--join`: the files' timings as one file (bench/profiling/profile_blend.py)."""
    from bench.profiling.profile_blend import join
    write_profile(out, join([(path, read_profile(path)) for path in paths]))
    fitted = load_measured(out)
    print(f"wrote {out}: {len(fitted.data.steps)} steps x {fitted.data.repeats} from "
          f"{len(paths)} files; the step-time fit is off by {fitted.fit_mape:.1%} on average")
    return 0


def _measure(args: argparse.Namespace, executor, model_dir) -> ProfileFile:
    """The grid timed on `executor`: the file without its live phase."""
    import torch
    from tqdm import tqdm

    from engines.executors.profiles.profile_grid import profile_grid
    from engines.hardware import hardware_for
    from engines.perf.model_shape import ModelShape

    repeats = args.repeats or (2 if args.quick else 3)
    max_context = executor.max_model_len
    grid = profile_grid(args.chunk_size, max_context, args.max_num_seqs,
                        (executor.num_kv_blocks - args.max_num_seqs) * executor.block_size,
                        quick=args.quick)
    with tqdm(total=len(grid) * repeats, desc="profiling", unit="step",
              file=sys.stderr) as bar:
        steps, skipped = timed_steps(executor, grid, repeats, progress=bar.update)
    if skipped:
        print(f"{skipped} grid steps did not fit the KV cache or the context", file=sys.stderr)
    cuda = executor.device.type == "cuda"
    return ProfileFile(
        format=PROFILE_FORMAT,
        device=(torch.cuda.get_device_name(executor.device) if cuda else
                f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"),
        torch_version=str(torch.__version__),
        driver_version=(torch.version.cuda or "") if cuda else "",
        model_dir=str(model_dir),
        model=ModelShape.from_config(executor.config, bytes_per_element=executor.dtype.itemsize),
        dtype=str(executor.dtype).removeprefix("torch."), tp=args.tp,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        block_size=executor.block_size, num_kv_blocks=executor.num_kv_blocks,
        max_model_len=max_context, hardware=hardware_for(executor.device, executor.dtype),
        repeats=repeats, steps=steps)


def _release_device() -> None:
    """Hand the profiled executor's memory back (a GPU's cache allocator keeps it)."""
    import gc

    import torch
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _time_host(args, profile: ProfileFile, device: str):
    """The live phase: a daemon on the profiled executor's settings, timed; its samples
    and the instance's own time a step."""
    from tqdm import tqdm
    batches = host_timing.host_batches(args.max_num_seqs, args.chunk_size)
    serve = host_timing.serve_args(profile.model_dir, args.device or device,
                                   profile.block_size, profile.num_kv_blocks,
                                   profile.max_model_len, args.chunk_size, args.max_num_seqs,
                                   args.tp, args.torch_threads)
    with tqdm(total=len(host_timing.host_plan(batches, profile.repeats)),
              desc="timing the daemon's path",
              unit="group", file=sys.stderr) as bar:
        return host_timing.time_host(serve, batches, profile.repeats, progress=bar.update)


def timed_steps(executor, grid, repeats: int, timer=None, progress=None,
                ) -> tuple[list[TimedStep], int]:
    """Each (kind, shape) of `grid` run `repeats` times on `executor` (`timer`: as
    engines/calibration.py `measure` takes it); the steps, and how many did not fit.

    The repetitions are passes over the whole grid, not runs back to back: a machine
    whose speed wanders from one second to the next (a shared VM's core) then slows
    every step's repetitions alike instead of a few steps all of theirs, and a step's
    median is a look at the whole profiling minute."""
    from engines.calibration import measure
    shapes = [shape for _, shape in grid]
    seconds: dict = {}
    skipped = 0
    for _ in range(repeats):
        timings, skipped = measure(executor, shapes, repeats=1, timer=timer, progress=progress)
        for shape, took in timings:
            seconds.setdefault(shape, []).append(took)
    return [TimedStep(kind, [tuple(p) for p in shape.prefills], list(shape.decodes),
                      seconds[shape]) for kind, shape in grid if shape in seconds], skipped


def compare(files: list[str], model: str | None) -> int:
    """FILE's steps: measured (median, spread), its fit, and OTHER's prediction."""
    if len(files) > 2:
        raise ValueError("--compare takes FILE and at most one OTHER")
    measured = load_measured(files[0])
    if model:
        from engines.models.model_config import ModelConfig
        from engines.perf.model_shape import ModelShape
        check_model(measured, ModelShape.from_config(ModelConfig.from_pretrained(model)), model)
    other = get_profile(files[1]) if len(files) == 2 else None
    print(f"{measured.name}: {measured.data.device}, {measured.data.model_dir} "
          f"({measured.data.dtype}, TP {measured.data.tp}), {measured.data.date}; "
          f"fit off by {measured.fit_mape:.1%} on average")
    head = (f"{'kind':<8}{'prefills (c,l)':<22}{'decodes':<16}{'measured ms':>12}"
            f"{'spread':>8}{'fit ms':>9}")
    print(head + (f"{'other ms':>10}{'other/meas':>11}" if other else ""))
    for step in measured.data.steps:
        shape = step.shape()
        low, high = (min(step.decodes), max(step.decodes)) if step.decodes else (0, 0)
        decodes = (f"{len(step.decodes)} x {high}" if low == high else
                   f"{len(step.decodes)} x {low}-{high}") if step.decodes else "-"
        prefills = " ".join(f"{c},{l}" for c, l in step.prefills) or "-"
        line = (f"{step.kind:<8}{prefills:<22}{decodes:<16}{step.median * 1e3:>12.2f}"
                f"{step.spread:>8.0%}{measured.step_time(shape) * 1e3:>9.2f}")
        if other is not None:
            predicted = other.step_time(shape)
            line += f"{predicted * 1e3:>10.2f}{predicted / step.median:>11.2f}"
        print(line)
    return 0

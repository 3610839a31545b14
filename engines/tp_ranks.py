"""A tensor-parallel instance's ranks: rank 0 (the instance process) starts, drives and
supervises ranks 1..K-1, one process each; `serve_rank` is the loop of one of those.

As vLLM's multiprocessing executor: the instance core and scheduler run once, on rank 0;
each step rank 0 sends the step's sequences (engines/tp_wire.py: msgspec over a ZeroMQ
PUSH socket per rank, never pickle) and every rank runs the same forward pass on its shard,
the all-reduces of the row-parallel layers meeting over torch.distributed
(engines/tp_group.py). Only rank 0 samples.

Faults: a rank that exits ends its instance -- rank 0's supervisor thread stops the other
ranks and exits the instance process with EXIT_RANK_LOST, and the daemon's recovery resumes
the instance's requests elsewhere; a rank whose rank 0 is gone exits too (it watches its
parent).
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import msgspec
import torch
import zmq

from engines import tp_wire
from engines.models.kv_transfer import check_frames, export_blocks, import_blocks
from engines.tp_group import check_devices, gather_to_first, join, leave, rank_device
from ipc.messages import KvLayout

log = logging.getLogger(__name__)

#: Exit code of an instance process whose rank died (engines/instance.py's are 0, 1, 3).
EXIT_RANK_LOST = 4
#: Seconds between the supervisors' checks (rank 0 on its ranks, a rank on its parent).
WATCH_INTERVAL_S = 0.2


class Ranks:
    """Rank 0's handle on ranks 1..K-1: their processes and command sockets."""

    def __init__(self, size: int, procs: list[subprocess.Popen], sockets: list,
                 context: zmq.Context, folder: str) -> None:
        self.size = size
        self.procs = procs
        self.sockets = sockets
        self.context = context
        self.folder = folder
        self.shard = None  # set once rank 0 has joined the group
        self._stopping = False
        threading.Thread(target=self._watch, name="tp-ranks", daemon=True).start()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def send(self, command) -> None:
        data = tp_wire.encode(command)
        for sock in self.sockets:
            sock.send(data, copy=False)

    def send_step(self, seqs) -> None:
        self.send(tp_wire.Step(seqs))

    def export_kv(self, executor, block_table: list[int], num_tokens: int):
        """Every KV head of a request's first `num_tokens` tokens, gathered from the ranks:
        the same layout a one-rank instance exports."""
        if num_tokens < 1 or len(block_table) * executor.block_size < num_tokens:
            raise ValueError(f"cannot export {num_tokens} tokens from {len(block_table)} blocks")
        self.send(tp_wire.ExportKv(list(block_table), num_tokens))
        return _export_joined(executor, block_table, num_tokens)

    def import_kv(self, executor, block_table: list[int], layout: KvLayout, frames) -> None:
        """Every rank writes its own heads of a hand-off's KV (checked here first, so no rank
        fails on it alone)."""
        _check_import(executor, block_table, layout, frames)
        frames = [bytes(memoryview(f)) for f in frames]
        self.send(tp_wire.ImportKv(list(block_table), layout, frames))
        _import_own_heads(executor, block_table, layout, frames)

    def stop(self) -> None:
        """Stop the ranks (a clean exit of the instance)."""
        if self._stopping:
            return
        self._stopping = True
        try:
            self.send(tp_wire.Stop())
        except zmq.ZMQError:
            pass
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for sock in self.sockets:
            sock.close(linger=0)
        leave()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _watch(self) -> None:
        """End the instance as soon as one of its ranks is gone."""
        while not self._stopping:
            for rank, proc in enumerate(self.procs, start=1):
                if proc.poll() is not None and not self._stopping:
                    log.error("tp rank %d (pid %d) exited with code %s: ending the instance",
                              rank, proc.pid, proc.returncode)
                    for other in self.procs:
                        if other.poll() is None:
                            other.kill()
                    shutil.rmtree(self.folder, ignore_errors=True)
                    os._exit(EXIT_RANK_LOST)
            time.sleep(WATCH_INTERVAL_S)


def start_ranks(config, model_dir: str):
    """Rank 0's TorchExecutor of a `config.tp`-rank instance, ranks 1..K-1 started."""
    from engines.executors.torch_executor import TorchExecutor
    from engines.models.model_config import ModelConfig
    from engines.models.tensor_parallel import check_divisible
    size = config.tp
    check_divisible(ModelConfig.from_pretrained(model_dir), size)
    check_devices(config.device, size)
    device = rank_device(config.device, 0)
    folder = tempfile.mkdtemp(prefix="ascendra-tp-")
    init_method = f"file://{folder}/rendezvous"
    context = zmq.Context.instance()
    sockets, procs = [], []
    for rank in range(1, size):
        sock = context.socket(zmq.PUSH)
        endpoint = f"ipc://{folder}/rank-{rank}"
        sock.bind(endpoint)
        sockets.append(sock)
        procs.append(_spawn(config, model_dir, rank, init_method, endpoint))
    ranks = Ranks(size, procs, sockets, context, folder)
    try:
        shard = join(0, size, init_method, device)
        ranks.shard = shard
        executor = TorchExecutor(model_dir, **_executor_kwargs(config, size, device),
                                 shard=shard, ranks=ranks)
    except BaseException:
        ranks.stop()
        raise
    return executor


def _executor_kwargs(config, size: int, device: torch.device) -> dict:
    threads = config.torch_threads or (max(1, (os.cpu_count() or 1) // size)
                                       if device.type == "cpu" else None)
    return dict(block_size=config.block_size, num_kv_blocks=config.num_kv_blocks,
                device=device, max_model_len=config.max_model_len,
                cuda_graph_max_batch=config.cuda_graph_max_batch, num_threads=threads)


def _spawn(config, model_dir: str, rank: int, init_method: str,
           endpoint: str) -> subprocess.Popen:
    from engines.instance_launch import PROJECT_ROOT
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        dict.fromkeys([str(PROJECT_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(
            os.pathsep) if p]))
    command = [sys.executable, "-m", "engines.tp_rank_main",
               "--executor-json", msgspec.json.encode(config).decode(), "--model-dir", model_dir,
               "--rank", str(rank), "--init", init_method, "--commands", endpoint,
               "--parent-pid", str(os.getpid())]
    return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)


def serve_rank(config, model_dir: str, rank: int, init_method: str, endpoint: str,
               parent_pid: int) -> int:
    """Rank `rank` (>= 1): run rank 0's commands on this shard until Stop."""
    from engines.executors.torch_executor import TorchExecutor
    _watch_parent(parent_pid)
    device = rank_device(config.device, rank)
    sock = zmq.Context.instance().socket(zmq.PULL)
    sock.connect(endpoint)
    shard = join(rank, config.tp, init_method, device)
    executor = TorchExecutor(model_dir, **_executor_kwargs(config, config.tp, device),
                             shard=shard)
    try:
        while True:
            command = tp_wire.decode(sock.recv())
            if isinstance(command, tp_wire.Step):
                executor.run_seqs(command.seqs)
            elif isinstance(command, tp_wire.ExportKv):
                _export_joined(executor, command.block_table, command.num_tokens)
            elif isinstance(command, tp_wire.ImportKv):
                _import_own_heads(executor, command.block_table, command.layout, command.frames)
            else:
                return 0
    finally:
        sock.close(linger=0)
        leave()


def _watch_parent(parent_pid: int) -> None:
    """Exit this rank as soon as its instance process (rank 0) is gone."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(WATCH_INTERVAL_S)
        os._exit(EXIT_RANK_LOST)

    threading.Thread(target=watch, name="tp-parent", daemon=True).start()


@torch.inference_mode()
def _export_joined(executor, block_table, num_tokens: int):
    """Each rank: export its heads and send them to rank 0. Rank 0: (layout, frames) of
    every head, joined; the others: None."""
    shard, config = executor.shard, executor.config
    layout, frames = export_blocks(executor.kv_caches, block_table, num_tokens,
                                   executor.block_size)
    own = torch.stack([torch.frombuffer(f, dtype=torch.uint8) for f in frames])
    parts = gather_to_first(shard, own)
    if parts is None:
        return None
    dtype = executor.kv_caches[0][0].dtype
    full = (2, layout.num_blocks, layout.block_size, config.num_key_value_heads, layout.head_dim)
    joined = []
    for layer in range(layout.num_layers):
        out = torch.empty(full, dtype=dtype)
        for rank, part in enumerate(parts):
            heads = type(shard)(rank, shard.size).kv_heads(config)
            out[:, :, :, heads.start:heads.stop] = part[layer].view(dtype).reshape(layout.shape)
        joined.append(memoryview(out.contiguous().view(torch.uint8).numpy()))
    layout = KvLayout(num_layers=layout.num_layers, num_blocks=layout.num_blocks,
                      block_size=layout.block_size, num_kv_heads=config.num_key_value_heads,
                      head_dim=layout.head_dim, dtype=layout.dtype, num_tokens=num_tokens)
    return layout, joined


def _check_import(executor, block_table, layout: KvLayout, frames) -> None:
    """ValueError unless every-head frames fit the model (its whole cache, all ranks')."""
    config = executor.config
    check_frames((config.num_hidden_layers, config.num_key_value_heads, config.head_dim),
                 block_table, layout, frames, executor.block_size)


@torch.inference_mode()
def _import_own_heads(executor, block_table, layout: KvLayout, frames) -> None:
    """Write this rank's heads of every-head frames into `block_table`."""
    config = executor.config
    if layout.num_kv_heads != config.num_key_value_heads:
        raise ValueError(f"KV of {layout.num_kv_heads} heads does not fit this model's "
                         f"{config.num_key_value_heads}")
    heads = executor.shard.kv_heads(config)
    dtype = getattr(torch, layout.dtype)
    own = []
    for frame in frames:
        whole = torch.frombuffer(bytearray(frame), dtype=torch.uint8).view(dtype)
        part = whole.reshape(layout.shape)[:, :, :, heads.start:heads.stop].contiguous()
        own.append(memoryview(part.view(torch.uint8).numpy()))
    local = KvLayout(num_layers=layout.num_layers, num_blocks=layout.num_blocks,
                     block_size=layout.block_size, num_kv_heads=len(heads),
                     head_dim=layout.head_dim, dtype=layout.dtype, num_tokens=layout.num_tokens)
    import_blocks(executor.kv_caches, block_table, local, own, executor.block_size)

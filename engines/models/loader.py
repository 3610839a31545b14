"""Load a Hugging Face Llama-family checkpoint folder into our `LlamaForCausalLM`.

The model is built on the meta device (no memory, no random init), materialised once on
the target device in the target dtype, and filled tensor by tensor from the safetensors
shards; q/k/v and gate/up are copied into their rows of the fused projections, the q and
k rows of each head reordered for the model's rotary layout (`rotary.interleave_order`).
Every parameter must be filled exactly once and every tensor in the files must be used,
or the load fails naming the tensor. On CPU the projection weights are then stored
column-major (see `_column_major`).

Under tensor parallelism (`shard`, engines/models/tensor_parallel.py) each rank reads only
its slice of every split tensor (`safe_open(...).get_slice`): the rows of its heads /
intermediate columns of q/k/v and gate/up, the matching columns of o_proj and down_proj;
the rest whole.

`select_ops` picks the model's element-wise ops for its device: the fused Triton kernels
(engines/models/triton_elementwise.py) on CUDA in fp16/bf16, else the torch reference
(engines/models/elementwise.py); it lives here, the one place a model is built, so that
the torch ops need not import the Triton ones that build on them.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open

from engines.models.elementwise import TorchOps
from engines.models.model_config import ModelConfig
from engines.models.llama import LlamaForCausalLM
from engines.models.rotary import interleave_order
from engines.models.tensor_parallel import Shard, check_divisible

# HF projection -> (our fused parameter, index of its row block)
_FUSED = {
    "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
}
# tensors some checkpoints carry that the model does not need
_IGNORED = re.compile(r"\.rotary_emb\.inv_freq$")
# tensors whose rows are per-head dims that RoPE rotates
_ROTATED = re.compile(r"\.self_attn\.[qk]_proj\.(weight|bias)$")


def default_dtype(config: ModelConfig, device: torch.device) -> torch.dtype:
    """fp32 on CPU; on CUDA bf16, or fp16 when the checkpoint says float16."""
    if device.type != "cuda":
        return torch.float32
    return torch.float16 if config.torch_dtype == "float16" else torch.bfloat16


def shard_files(model_dir: str | Path) -> list[Path]:
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        with open(index, encoding="utf-8") as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        files = [model_dir / name for name in names]
        missing = [str(p) for p in files if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"shards listed in {index.name} are missing: {missing}")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    return files


class _Target:
    """Where one checkpoint tensor goes: `param` (a view of a model parameter) is filled
    from the tensor's `part` along dimension `dim` (None: the whole tensor), whose full
    length along it is `full`."""

    __slots__ = ("param", "dim", "part", "full")

    def __init__(self, param: torch.Tensor, dim: int | None = None, part: range | None = None,
                 full: int = 0) -> None:
        self.param, self.dim, self.part, self.full = param, dim, part, full

    def read(self, f, name: str) -> torch.Tensor:
        """The tensor's slice this rank holds (only that slice is read from the file)."""
        if self.dim is None:
            return f.get_tensor(name)
        piece = f.get_slice(name)
        shape = piece.get_shape()
        if len(shape) <= self.dim or shape[self.dim] != self.full:
            raise ValueError(f"tensor {name!r} has shape {tuple(shape)}, expected "
                             f"{self.full} along dimension {self.dim}")
        lo, hi = self.part.start, self.part.stop
        return piece[lo:hi] if self.dim == 0 else piece[:, lo:hi]


def _row_parts(config: ModelConfig, shard: Shard) -> dict[str, tuple[range, int]]:
    """HF projection -> (this rank's rows of it, its full rows)."""
    d = config.head_dim
    heads, kv, inter = shard.heads(config), shard.kv_heads(config), shard.intermediate(config)
    q_rows = range(heads.start * d, heads.stop * d)
    kv_rows = range(kv.start * d, kv.stop * d)
    return {"q_proj": (q_rows, config.q_size), "k_proj": (kv_rows, config.kv_size),
            "v_proj": (kv_rows, config.kv_size),
            "gate_proj": (inter, config.intermediate_size),
            "up_proj": (inter, config.intermediate_size)}


def _targets(config: ModelConfig, params: dict[str, torch.Tensor],
             shard: Shard = Shard()) -> dict[str, _Target]:
    """Every HF tensor name we expect -> the (view of the) parameter it fills and the part
    of the tensor this rank reads."""
    rows = _row_parts(config, shard)
    d = config.head_dim
    heads = shard.heads(config)
    columns = {"o_proj": (range(heads.start * d, heads.stop * d), config.q_size),
               "down_proj": (shard.intermediate(config), config.intermediate_size)}
    targets = {}
    for name, param in params.items():
        match = re.match(r"^(.*)\.(qkv_proj|gate_up_proj)\.(weight|bias)$", name)
        if match:
            prefix, fused, kind = match.groups()
            lo = 0
            for hf_proj, (target, _) in _FUSED.items():
                if target == fused:
                    part, full = rows[hf_proj]
                    view = param[lo:lo + len(part)]
                    lo += len(part)
                    targets[f"{prefix}.{hf_proj}.{kind}"] = (
                        _Target(view, 0, part, full) if shard.parallel else _Target(view))
            continue
        proj = re.match(r"^.*\.(o_proj|down_proj)\.weight$", name)
        if proj and shard.parallel:
            part, full = columns[proj.group(1)]
            targets[name] = _Target(param, 1, part, full)
        else:
            targets[name] = _Target(param)
    return targets


def load_model(model_dir: str | Path, backend, *, config: ModelConfig | None = None,
               device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
               shard: Shard = Shard()) -> LlamaForCausalLM:
    """The model, or this rank's shard of it (`shard`)."""
    config = config or ModelConfig.from_pretrained(model_dir)
    check_divisible(config, shard.size)
    device = torch.device(device)
    dtype = dtype or default_dtype(config, device)
    with torch.device("meta"):
        model = LlamaForCausalLM(config, backend, select_ops(device, dtype), shard)
    model = model.to(dtype=dtype).to_empty(device=device)
    _fill(model, config, shard_files(model_dir), shard)
    if device.type == "cpu":
        _column_major(model)
    model.init_rope(device)
    return model.eval().requires_grad_(False)


def _column_major(model: LlamaForCausalLM) -> None:
    """Store every Linear weight [out, in] column-major (its transpose is contiguous).

    `F.linear` then hands MKL's sgemm an untransposed [in, out] B, which runs ~1.6x faster
    for the few rows of a decode step (16 rows: 66 vs 110 us for a 256 x 1376 weight) and
    gives bit-identical results from 16 rows up. Shapes, names and values are unchanged."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.weight.data = module.weight.data.t().contiguous().t()


def _rope_rows(tensor: torch.Tensor, head_dim: int) -> torch.Tensor:
    """A q/k projection's rows (weight or bias) with each head's dims pair-interleaved."""
    heads = tensor.shape[0] // head_dim
    order = interleave_order(head_dim)
    return tensor.unflatten(0, (heads, head_dim))[:, order].flatten(0, 1)


@torch.no_grad()
def _fill(model: LlamaForCausalLM, config: ModelConfig, files: list[Path],
          shard: Shard = Shard()) -> None:
    targets = _targets(config, dict(model.named_parameters()), shard)
    remaining = set(targets)
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                if _IGNORED.search(name):
                    continue
                if name == "lm_head.weight" and config.tie_word_embeddings:
                    continue  # some tied checkpoints store the shared matrix twice
                target = targets.get(name)
                if target is None:
                    raise ValueError(f"{path.name}: unexpected tensor {name!r} "
                                     f"for a {config.model_type} model")
                try:
                    tensor = target.read(f, name)
                except ValueError as exc:
                    raise ValueError(f"{path.name}: {exc}") from None
                if tuple(tensor.shape) != tuple(target.param.shape):
                    raise ValueError(f"{path.name}: tensor {name!r} has shape "
                                     f"{tuple(tensor.shape)}, expected {tuple(target.param.shape)}")
                if _ROTATED.search(name):
                    tensor = _rope_rows(tensor, config.head_dim)
                target.param.copy_(tensor)
                remaining.discard(name)
    if remaining:
        raise ValueError(f"checkpoint is missing tensors: {sorted(remaining)}")


def select_ops(device: torch.device, dtype: torch.dtype):
    """The fused kernels on CUDA in fp16/bf16 when Triton imports; torch ops otherwise."""
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return TorchOps
    try:
        from engines.models.triton_elementwise import TritonOps
    except ImportError:
        return TorchOps
    return TritonOps

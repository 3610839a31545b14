"""A tiny Llama / Qwen2 / Mistral checkpoint with seeded random weights, in the real
Hugging Face folder format, so tests and the demo daemon exercise the real loading path.
The same code writes a full-size shape (`SHAPES`, e.g. Llama-3-8B's) for GPU runs: its
weights are drawn on the GPU in the model's dtype and saved in shards with an index, as
the hub's checkpoints are; its tokenizer is still the tiny one (token ids past it decode
to no text).

The weights are random but chosen to give peaked next-token distributions (greedy decoding
has clear winners, which keeps HF-parity tests meaningful) and attention that actually
depends on position. Same seed -> byte-identical files.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from engines.models import tiny_tokenizer
from engines.models.model_config import ModelConfig

ARCHS = ("llama", "qwen2", "mistral")

_COMMON = {
    "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5, "hidden_act": "silu", "initializer_range": 0.02,
    "attention_dropout": 0.0, "use_cache": True, "torch_dtype": "float32",
}

_ARCH = {
    "llama": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "rope_theta": 500000.0, "tie_word_embeddings": False,
        "attention_bias": False, "mlp_bias": False,
        # Llama 3.1 scaling with a short original context, so it changes the frequencies
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
    },
    "qwen2": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "rope_theta": 1000000.0, "tie_word_embeddings": True, "intermediate_size": 704,
        "use_sliding_window": False, "sliding_window": 2048, "max_window_layers": 4,
    },
    "mistral": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral",
        "rope_theta": 10000.0, "tie_word_embeddings": False, "sliding_window": 4096,
    },
}

#: config.json fields of full-size shapes, over the arch's (Llama-3-8B: Meta's config).
SHAPES = {
    "tiny": {},
    # a tiny model of another shape (3 layers, 4 KV heads): a multiplexed instance's
    # models of different shapes share one KV pool (engines/kv_pool.py)
    "tiny-3x4": {"num_hidden_layers": 3, "num_key_value_heads": 4},
    "llama3-8b": {
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 8192,
        "vocab_size": 128256, "rope_theta": 500000.0, "rope_scaling": None,
        "torch_dtype": "bfloat16",
    },
}
#: Largest safetensors shard of a full-size checkpoint.
SHARD_BYTES = 5 * 2**30

# std of the random matrices: large enough for confident logits and sharp attention
# (a tied embedding is also the LM head, so it takes the head's std)
_STD = {"embed": 1.0, "attn": 0.1, "mlp": 0.06, "lm_head": 0.25, "bias": 0.1}


def tiny_config(arch: str = "llama", shape: str = "tiny") -> dict:
    if arch not in _ARCH:
        raise ValueError(f"unknown tiny model arch {arch!r} (choose from {', '.join(ARCHS)})")
    if shape not in SHAPES:
        raise ValueError(f"unknown model shape {shape!r} (choose from {', '.join(SHAPES)})")
    ids = tiny_tokenizer.token_ids()
    raw = {**_COMMON, **_ARCH[arch], "vocab_size": tiny_tokenizer.VOCAB_SIZE,
           "bos_token_id": ids[tiny_tokenizer.BOS], "eos_token_id": ids[tiny_tokenizer.EOS],
           **SHAPES[shape]}
    return {key: value for key, value in raw.items() if value is not None}


def _shapes(config: ModelConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """HF tensor name -> (shape, kind), in a fixed order (the order random draws happen)."""
    h, q, kv, inter = config.hidden_size, config.q_size, config.kv_size, config.intermediate_size
    embed_kind = "lm_head" if config.tie_word_embeddings else "embed"
    shapes = {"model.embed_tokens.weight": ((config.vocab_size, h), embed_kind)}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = ((h,), "norm")
        for proj, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            shapes[f"{p}self_attn.{proj}.weight"] = ((rows, h), "attn")
            if config.qkv_bias:
                shapes[f"{p}self_attn.{proj}.bias"] = ((rows,), "bias")
        shapes[p + "self_attn.o_proj.weight"] = ((h, q), "attn")
        shapes[p + "post_attention_layernorm.weight"] = ((h,), "norm")
        shapes[p + "mlp.gate_proj.weight"] = ((inter, h), "mlp")
        shapes[p + "mlp.up_proj.weight"] = ((inter, h), "mlp")
        shapes[p + "mlp.down_proj.weight"] = ((h, inter), "mlp")
    shapes["model.norm.weight"] = ((h,), "norm")
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = ((config.vocab_size, h), "lm_head")
    return shapes


def random_weights(config: ModelConfig, seed: int, device: str = "cpu",
                   dtype: torch.dtype = torch.float32, std: float | None = None,
                   ) -> dict[str, torch.Tensor]:
    """Seeded random weights; `std` (default: per kind, for the tiny model's peaked
    distributions) for every matrix."""
    generator = torch.Generator(device=device).manual_seed(seed)
    weights = {}
    for name, (shape, kind) in _shapes(config).items():
        if kind == "norm":
            weights[name] = torch.ones(shape, device=device, dtype=dtype)
        else:
            draw = torch.randn(shape, generator=generator, device=device, dtype=dtype)
            weights[name] = draw.mul_(_STD[kind] if std is None else std)
    return weights


def _save_shards(weights: dict[str, torch.Tensor], out_dir: Path) -> None:
    """model-0000k-of-0000n.safetensors of at most SHARD_BYTES each, and their index."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in weights.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    weight_map = {}
    for k, shard in enumerate(shards, 1):
        file = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: t.cpu() for n, t in shard.items()}, str(out_dir / file),
                  metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in weights.values())
    _write_json(out_dir / "model.safetensors.index.json",
                {"metadata": {"total_size": total}, "weight_map": weight_map})


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def make_tiny_model(out_dir: str | Path, seed: int = 0, arch: str = "llama",
                    shape: str = "tiny", device: str = "cpu") -> Path:
    """Write an `arch` checkpoint (config, weights, tokenizer) of `shape` into `out_dir`;
    a full-size shape's weights are drawn on `device` (a GPU: seconds, not minutes)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = tiny_config(arch, shape)
    config = ModelConfig.from_dict(raw)
    _write_json(out_dir / "config.json", raw)
    _write_json(out_dir / "generation_config.json", {
        "bos_token_id": raw["bos_token_id"], "eos_token_id": raw["eos_token_id"]})
    if shape.startswith("tiny"):
        save_file(random_weights(config, seed), str(out_dir / "model.safetensors"),
                  metadata={"format": "pt"})
    else:
        dtype = getattr(torch, raw["torch_dtype"])
        _save_shards(random_weights(config, seed, device, dtype, std=raw["initializer_range"]),
                     out_dir)
    tiny_tokenizer.write_tokenizer_files(out_dir, model_max_length=config.max_model_len)
    return out_dir

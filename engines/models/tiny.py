"""A tiny Llama / Qwen2 / Mistral checkpoint with seeded random weights, in the real
Hugging Face folder format, so tests and the demo daemon exercise the real loading path.

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
from engines.models.config import ModelConfig

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

# std of the random matrices: large enough for confident logits and sharp attention
# (a tied embedding is also the LM head, so it takes the head's std)
_STD = {"embed": 1.0, "attn": 0.1, "mlp": 0.06, "lm_head": 0.25, "bias": 0.1}


def tiny_config(arch: str = "llama") -> dict:
    if arch not in _ARCH:
        raise ValueError(f"unknown tiny model arch {arch!r} (choose from {', '.join(ARCHS)})")
    ids = tiny_tokenizer.token_ids()
    return {**_COMMON, **_ARCH[arch], "vocab_size": tiny_tokenizer.VOCAB_SIZE,
            "bos_token_id": ids[tiny_tokenizer.BOS], "eos_token_id": ids[tiny_tokenizer.EOS]}


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


def random_weights(config: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for name, (shape, kind) in _shapes(config).items():
        if kind == "norm":
            weights[name] = torch.ones(shape)
        else:
            weights[name] = torch.randn(shape, generator=generator) * _STD[kind]
    return weights


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def make_tiny_model(out_dir: str | Path, seed: int = 0, arch: str = "llama") -> Path:
    """Write a tiny `arch` checkpoint (config, weights, tokenizer) into `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = tiny_config(arch)
    config = ModelConfig.from_dict(raw)
    _write_json(out_dir / "config.json", raw)
    _write_json(out_dir / "generation_config.json", {
        "bos_token_id": raw["bos_token_id"], "eos_token_id": raw["eos_token_id"]})
    save_file(random_weights(config, seed), str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})
    tiny_tokenizer.write_tokenizer_files(out_dir, model_max_length=config.max_model_len)
    return out_dir

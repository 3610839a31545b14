"""The model's shape, read from a Hugging Face `config.json` (Llama, Mistral, Qwen2).

Only what the torch model needs is kept. Anything the model cannot honour (an unknown
architecture, an unsupported RoPE scaling) is an error here, at load time, never a silent
difference in the outputs.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE_TYPES = ("llama3", "linear")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    rope_type: str                 # "llama3" or "linear"
    factor: float
    low_freq_factor: float = 1.0   # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position_embeddings: int = 8192  # llama3 only


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    sliding_window: int | None
    torch_dtype: str
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    @property
    def max_model_len(self) -> int:
        """The longest context we serve: sliding-window attention is not implemented, so a
        model trained with a window smaller than its position range is capped at the window."""
        if self.sliding_window is not None and self.sliding_window < self.max_position_embeddings:
            return self.sliding_window
        return self.max_position_embeddings

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ModelConfig":
        return _parse(raw)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json in {model_dir}")
        with open(path, encoding="utf-8") as f:
            return _parse(json.load(f), source=str(path))


def _require(raw: dict[str, Any], key: str, source: str) -> Any:
    if raw.get(key) is None:
        raise ValueError(f"{source}: missing required field {key!r}")
    return raw[key]


def _token_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _parse_rope(raw: dict[str, Any], source: str) -> tuple[float, RopeScaling | None]:
    """RoPE base and scaling, from the classic `rope_theta` + `rope_scaling` keys or from the
    newer combined `rope_parameters` dict (transformers 5)."""
    params = raw.get("rope_parameters") or {}
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    scaling = raw.get("rope_scaling") or (params if "rope_type" in params else None)
    if not scaling:
        return theta, None
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind in (None, "default"):
        return theta, None
    if kind not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"{source}: unsupported rope scaling type {kind!r} "
                         f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})")
    factor = float(_require(scaling, "factor", f"{source} rope_scaling"))
    if kind == "linear":
        return theta, RopeScaling("linear", factor)
    return theta, RopeScaling(
        "llama3", factor,
        low_freq_factor=float(_require(scaling, "low_freq_factor", f"{source} rope_scaling")),
        high_freq_factor=float(_require(scaling, "high_freq_factor", f"{source} rope_scaling")),
        original_max_position_embeddings=int(_require(
            scaling, "original_max_position_embeddings", f"{source} rope_scaling")),
    )


def _sliding_window(raw: dict[str, Any], model_type: str) -> int | None:
    if model_type == "qwen2" and not raw.get("use_sliding_window", False):
        return None  # Qwen2 configs carry a window they do not use unless asked
    if model_type == "llama":
        return None
    window = raw.get("sliding_window", 4096)  # transformers' default when the key is absent
    return int(window) if window else None


def _parse(raw: dict[str, Any], source: str = "config.json") -> ModelConfig:
    model_type = _require(raw, "model_type", source)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"{source}: unsupported model_type {model_type!r} "
                         f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    hidden = int(_require(raw, "hidden_size", source))
    heads = int(_require(raw, "num_attention_heads", source))
    theta, scaling = _parse_rope(raw, source)
    attention_bias = bool(raw.get("attention_bias", False))
    return ModelConfig(
        model_type=model_type,
        vocab_size=int(_require(raw, "vocab_size", source)),
        hidden_size=hidden,
        intermediate_size=int(_require(raw, "intermediate_size", source)),
        num_hidden_layers=int(_require(raw, "num_hidden_layers", source)),
        num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(_require(raw, "max_position_embeddings", source)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=model_type != "qwen2" and attention_bias,
        mlp_bias=bool(raw.get("mlp_bias", False)),
        sliding_window=_sliding_window(raw, model_type),
        torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_token_ids(raw.get("eos_token_id")),
    )


def generation_eos_ids(model_dir: str | Path) -> tuple[int, ...]:
    """EOS ids from `generation_config.json` (instruct models often list several there)."""
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return ()
    with open(path, encoding="utf-8") as f:
        return _token_ids(json.load(f).get("eos_token_id"))

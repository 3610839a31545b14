"""The sizes of a Llama-family model that decide how much a batch costs.

Read from a Hugging Face config dict or from anything with the same attribute names
(our `engines.models.model_config.ModelConfig`), so policies/ need not import the engines.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float64": 8}


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    bytes_per_element: int = 2
    #: queries per tile of the flash-attention kernel (the paper's b): K/V are read once per tile
    attn_block: int = 128

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of K (or V) for one token: GQA makes it kv_heads/heads of the query width."""
        return self.kv_heads * self.head_dim

    @property
    def layer_weights(self) -> int:
        """Elements of one decoder layer's matrices: q/k/v/o and the gated MLP."""
        attention = self.hidden * (2 * self.q_size + 2 * self.kv_size)
        return attention + 3 * self.hidden * self.intermediate

    @classmethod
    def from_config(cls, config: Any, bytes_per_element: int | None = None) -> "ModelShape":
        """From a HF config dict or an object with HF attribute names (our ModelConfig).

        `bytes_per_element` defaults to the config's dtype (2 when it names none); pass the
        dtype the executor really runs in when it differs."""
        get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
        hidden, heads = int(get("hidden_size")), int(get("num_attention_heads"))
        if bytes_per_element is None:
            dtype = str(get("torch_dtype") or get("dtype") or "bfloat16").removeprefix("torch.")
            bytes_per_element = _DTYPE_BYTES.get(dtype, 2)
        return cls(
            layers=int(get("num_hidden_layers")), hidden=hidden, heads=heads,
            kv_heads=int(get("num_key_value_heads") or heads),
            head_dim=int(get("head_dim") or hidden // heads),
            intermediate=int(get("intermediate_size")), vocab=int(get("vocab_size")),
            bytes_per_element=int(bytes_per_element),
        )

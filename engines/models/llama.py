"""A Llama-family decoder (Llama, Mistral, Qwen2) for serving.

Differences from the Hugging Face modules, all for speed: q/k/v are one Linear and
gate/up are one Linear (fused by the loader); the forward pass runs over a flattened
mixed batch of prefill chunks and decodes with per-token positions, writing K/V into a
paged cache; the LM head runs only on the rows that sample; and each head's q/k rows are
stored pair-interleaved (the loader reorders them) so RoPE is one complex multiplication
(engines/models/rotary.py). The element-wise steps between the matrix products (residual
add + RMSNorm, RoPE, SiLU * up) go through `ops` (engines/models/elementwise.py): torch
ops, or one fused Triton kernel each on CUDA; so a layer passes its output and the
residual stream on separately, and the next layer's norm adds them. Parameter names mirror
Hugging Face's (`model.layers.0.self_attn...`) apart from the two fused projections.

Under tensor parallelism (`shard`, engines/models/tensor_parallel.py) a rank's fused
projections hold its heads / intermediate columns only, and o_proj and down_proj end in
one all-reduce each (`_row_linear`); the names stay the same, the shapes are the rank's.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engines.models.elementwise import TorchOps
from engines.models.model_config import ModelConfig
from engines.models.rotary import rotation_table
from engines.models.tensor_parallel import Shard


def _linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """`layer(x)` without the module call and its hook checks (the step's hot path)."""
    return F.linear(x, layer.weight, layer.bias)


def _row_linear(x: torch.Tensor, layer: nn.Linear, shard: Shard) -> torch.Tensor:
    """A row-parallel `layer(x)`: this rank's partial product summed over the ranks, the
    bias added once after the sum."""
    if not shard.parallel:
        return _linear(x, layer)
    out = shard.all_reduce(F.linear(x, layer.weight))
    return out if layer.bias is None else out.add_(layer.bias)


class RMSNorm(nn.Module):
    """An RMSNorm's weight and epsilon; `ops.add_rms_norm` applies them."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, backend, ops, shard: Shard) -> None:
        super().__init__()
        self.ops = ops
        self.shard = shard
        self.num_heads = len(shard.heads(config))
        self.num_kv_heads = len(shard.kv_heads(config))
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * config.head_dim
        self.kv_size = self.num_kv_heads * config.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size,
                                  bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.o_bias)
        self.backend = backend

    def forward(self, x, rotation, kv_cache, meta) -> torch.Tensor:
        q, k, v = self.project(x, rotation)
        return self.output(self.backend(q, k, v, kv_cache[0], kv_cache[1], meta))

    def project(self, x, rotation):
        """(q [tokens, heads, dim], k, v [tokens, kv_heads, dim]) of `x`, q and k rotated."""
        tokens, qk_size = x.shape[0], self.q_size + self.kv_size
        qkv = _linear(x, self.qkv_proj)
        # rotate q and k in one go: they are adjacent columns of qkv
        qk = self.ops.rotate_qk(qkv[:, :qk_size].view(tokens, -1, self.head_dim), rotation)
        q, k = qk[:, :self.num_heads], qk[:, self.num_heads:]
        v = qkv[:, qk_size:].view(tokens, self.num_kv_heads, self.head_dim)
        return q, k, v

    def output(self, attended: torch.Tensor) -> torch.Tensor:
        """o_proj of the attention's output [tokens, heads * dim]."""
        return _row_linear(attended, self.o_proj, self.shard)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, ops, shard: Shard) -> None:
        super().__init__()
        self.ops = ops
        self.shard = shard
        size = len(shard.intermediate(config))
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _row_linear(self.ops.silu_and_mul(_linear(x, self.gate_up_proj)), self.down_proj,
                           self.shard)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, backend, ops, shard: Shard) -> None:
        super().__init__()
        self.ops = ops
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, backend, ops, shard)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config, ops, shard)

    def forward(self, x, residual, rotation, kv_cache, meta):
        """x: the previous layer's output (the first layer: the embeddings) and residual
        the stream it adds to (the first layer: None). Returns this layer's (output,
        residual): `residual + output` is what transformers' layer returns."""
        h, residual = self.ops.add_rms_norm(x, residual, self.input_layernorm.weight,
                                            self.input_layernorm.eps)
        h = self.self_attn(h, rotation, kv_cache, meta)
        h, residual = self.ops.add_rms_norm(h, residual, self.post_attention_layernorm.weight,
                                            self.post_attention_layernorm.eps)
        return self.mlp(h), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, backend, ops, shard: Shard) -> None:
        super().__init__()
        # Built on the meta device and filled from the checkpoint (engines/models/loader.py):
        # an initial weight skips nn.Embedding's random init, which on the meta device goes
        # through torch's reference ops and imports TorchDynamo and Triton (2 s of an
        # instance's start, and Triton's leak report at every exit).
        self.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size,
            _weight=torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(config, backend, ops, shard)
                                    for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """`forward(input_ids, positions, kv_caches, meta, logits_indices) -> logits`.

    input_ids, positions: [tokens] (the flattened batch, in the attention backend's layout);
    kv_caches: one (k, v) pair per layer; meta: the backend's per-step metadata;
    logits_indices: the rows whose next-token logits are wanted; ops: TorchOps or
    TritonOps (engines/models/elementwise.py); shard: this rank's part of the model
    (engines/models/tensor_parallel.py; the default: all of it)."""

    def __init__(self, config: ModelConfig, backend, ops=TorchOps, shard: Shard = Shard()) -> None:
        super().__init__()
        self.config = config
        self.ops = ops
        self.shard = shard
        self.model = LlamaModel(config, backend, ops, shard)
        self.lm_head = (None if config.tie_word_embeddings else
                        nn.Linear(config.hidden_size, config.vocab_size, bias=False))
        self.rope: torch.Tensor | None = None

    def set_ops(self, ops) -> None:
        """Run the element-wise steps with `ops` from now on (benchmarks compare them)."""
        for module in self.modules():
            if isinstance(module, (LlamaForCausalLM, DecoderLayer, Attention, MLP)):
                module.ops = ops

    def init_rope(self, device: torch.device) -> None:
        """Tabulate the rotation of every usable position (after the weights are on `device`)."""
        self.rope = rotation_table(self.config, self.config.max_model_len, device)

    def forward(self, input_ids, positions, kv_caches, meta, logits_indices) -> torch.Tensor:
        rotation = self.ops.rotation(self.rope, positions)
        x, residual = self.model.embed_tokens(input_ids), None
        for layer, kv_cache in zip(self.model.layers, kv_caches):
            x, residual = layer(x, residual, rotation, kv_cache, meta)
        return self.logits(x.index_select(0, logits_indices),
                           residual.index_select(0, logits_indices))

    def logits(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """The next-token logits of rows whose last layer gave (x, residual)."""
        norm = self.model.norm
        x, _ = self.ops.add_rms_norm(x, residual, norm.weight, norm.eps)
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(x, weight)

"""config.json parsing and RoPE frequencies (checked against transformers).

Covers: engines/models/model_config.py, engines/models/rotary.py.
"""
from __future__ import annotations

import pytest
import torch

from engines.models.model_config import ModelConfig
from engines.models.rotary import inverse_frequencies
from engines.models.tiny import ARCHS, tiny_config

BASE = {"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 4096}


def test_defaults_and_derived_fields():
    config = ModelConfig.from_dict({**BASE, "eos_token_id": [7, 9]})
    assert config.num_key_value_heads == 4 and config.head_dim == 16
    assert config.rope_scaling is None and config.rope_theta == 10000.0
    assert config.eos_token_ids == (7, 9)
    assert not config.qkv_bias and not config.tie_word_embeddings
    assert config.max_model_len == 4096


def test_unknown_model_type_and_missing_field_are_named():
    with pytest.raises(ValueError, match="gpt_neox"):
        ModelConfig.from_dict({**BASE, "model_type": "gpt_neox"})
    without = {k: v for k, v in BASE.items() if k != "intermediate_size"}
    with pytest.raises(ValueError, match="intermediate_size"):
        ModelConfig.from_dict(without)
    with pytest.raises(ValueError, match="yarn"):
        ModelConfig.from_dict({**BASE, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})


def test_mistral_sliding_window_caps_context():
    mistral = {**BASE, "model_type": "mistral"}
    assert ModelConfig.from_dict({**mistral, "sliding_window": 1024}).max_model_len == 1024
    assert ModelConfig.from_dict({**mistral, "sliding_window": None}).max_model_len == 4096
    assert ModelConfig.from_dict(mistral).max_model_len == 4096  # transformers' default 4096


def test_qwen2_has_qkv_bias_and_ignores_unused_window():
    config = ModelConfig.from_dict({**BASE, "model_type": "qwen2", "sliding_window": 512,
                                    "use_sliding_window": False})
    assert config.qkv_bias and not config.o_bias and config.max_model_len == 4096


def test_rope_parameters_format_of_transformers_5():
    config = ModelConfig.from_dict({**BASE, "rope_parameters": {
        "rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}})
    assert config.rope_theta == 1e6 and config.rope_scaling.factor == 2.0


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_rope_frequencies_match_transformers(arch):
    transformers = pytest.importorskip("transformers")
    raw = tiny_config(arch)
    hf_config = transformers.AutoConfig.for_model(**raw)
    model_cls = getattr(transformers, raw["architectures"][0])
    rotary = model_cls(hf_config).model.rotary_emb
    ours = inverse_frequencies(ModelConfig.from_dict(raw))
    assert torch.equal(ours, rotary.inv_freq)
    if arch == "llama":  # the Llama-3 scaling really moves some frequencies
        plain = inverse_frequencies(ModelConfig.from_dict({**raw, "rope_scaling": None}))
        assert not torch.equal(ours, plain)

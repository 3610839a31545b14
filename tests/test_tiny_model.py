"""The tiny checkpoint: reproducible files that Hugging Face and our own loaders both read.

Covers: engines/models/tiny.py, engines/models/loader.py, daemon/tiny_model_cmd.py.
"""
from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engines.models.attention import SdpaAttention
from engines.models.loader import load_model
from engines.models.rotary import interleave_order
from engines.models.tiny import ARCHS, make_tiny_model
from engines.models.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

TEXTS = [
    "The weather was cold and bright.",
    "  two  spaces, a tab\tand\n\nnew lines ",
    "Zürich café naïve — 東京 🙂 ½ ñ",
    "12345 numbers 3.14159 and symbols #@!$%^&*()",
    "",
]


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_same_seed_same_bytes_different_seed_different_weights(tmp_path):
    first = _files(make_tiny_model(tmp_path / "a", seed=3))
    again = _files(make_tiny_model(tmp_path / "b", seed=3))
    other = _files(make_tiny_model(tmp_path / "c", seed=4))
    assert first == again
    assert set(first) >= {"config.json", "generation_config.json", "model.safetensors",
                          "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    assert first["model.safetensors"] != other["model.safetensors"]
    assert first["tokenizer.json"] == other["tokenizer.json"]


def test_make_tiny_model_verb_tells_where_the_model_and_tokenizer_are(tmp_path, capsys):
    from daemon.cli import main
    folder = tmp_path / "tiny"
    assert main(["make-tiny-model", str(folder), "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
    assert str(folder) in out
    assert f"--tokenizer {folder}" in out


def test_unknown_arch_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="gpt2"):
        make_tiny_model(tmp_path, arch="gpt2")


@pytest.mark.slow  # imports transformers
@pytest.mark.parametrize("arch", ARCHS)
def test_hugging_face_loads_model_and_tokenizer(tiny_models, arch):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_models[arch],
                                                              dtype=torch.float32)
    expected = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "mistral": "MistralForCausalLM"}[arch]
    assert type(model).__name__ == expected
    hf_tok = transformers.AutoTokenizer.from_pretrained(tiny_models[arch])
    assert hf_tok.bos_token == "<|begin_of_text|>" and hf_tok.eos_token == "<|end_of_text|>"
    assert model.config.vocab_size == len(hf_tok)


@pytest.mark.parametrize("arch", ARCHS)
def test_tokenizer_round_trips_and_agrees_with_hugging_face(tiny_models, arch):
    ours = Tokenizer(tiny_models[arch])
    hf_tok = transformers.AutoTokenizer.from_pretrained(tiny_models[arch])
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == hf_tok(text)["input_ids"], text
        assert ids[0] == ours.bos_token_id
        assert ours.encode(text, add_bos=False) == ids[1:]
        assert ours.decode(ids) == text
        assert ours.decode(ids, skip_special_tokens=False) == "<|begin_of_text|>" + text
    assert ours.eos_token_ids == {hf_tok.eos_token_id}
    assert ours.vocab_size == len(hf_tok)


def test_chat_template_matches_hugging_face(tiny_models):
    ours = Tokenizer(tiny_models["llama"])
    hf_tok = transformers.AutoTokenizer.from_pretrained(tiny_models["llama"])
    chat = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi there, ça va?"},
            {"role": "assistant", "content": "Yes."},
            {"role": "user", "content": "Good."}]
    for prompt in (True, False):
        text = ours.apply_chat_template(chat, add_generation_prompt=prompt)
        assert text == hf_tok.apply_chat_template(chat, tokenize=False,
                                                  add_generation_prompt=prompt)
    ids = ours.encode_chat(chat)
    hf_ids = hf_tok.apply_chat_template(chat, tokenize=True, add_generation_prompt=True)
    hf_ids = hf_ids["input_ids"] if hasattr(hf_ids, "keys") else hf_ids  # a dict in transformers 5
    assert ids == list(hf_ids)
    assert ids.count(ours.bos_token_id) == 1
    assert text.endswith("<|user|>\nGood.<|end_of_text|>\n")


def test_chat_template_fallback_without_jinja(tiny_models):
    from engines.models.tokenizer import _render_without_jinja, render_chat
    ours = Tokenizer(tiny_models["llama"])
    chat = [{"role": "user", "content": "hello"}]
    specials = dict(bos_token=ours.bos_token, eos_token=ours.eos_token)
    assert (_render_without_jinja(ours.chat_template, chat, True, **specials)
            == render_chat(ours.chat_template, chat, True, **specials))


def _copy_with(tmp_path, folder, edit):
    target = tmp_path / "edited"
    shutil.copytree(folder, target)
    weights = load_file(str(target / "model.safetensors"))
    edit(weights)
    save_file(weights, str(target / "model.safetensors"))
    return target


def test_loader_names_missing_and_unexpected_tensors(tiny_models, tmp_path):
    backend = SdpaAttention(16, torch.device("cpu"))
    name = "model.layers.1.self_attn.k_proj.weight"
    missing = _copy_with(tmp_path / "m", tiny_models["llama"], lambda w: w.pop(name))
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        load_model(missing, backend)
    extra = _copy_with(tmp_path / "x", tiny_models["llama"],
                       lambda w: w.update({"model.layers.0.mystery.weight": torch.ones(2)}))
    with pytest.raises(ValueError, match="mystery"):
        load_model(extra, backend)


def test_loader_fuses_projections(tiny_models):
    model = load_model(tiny_models["qwen2"], SdpaAttention(16, torch.device("cpu")))
    weights = load_file(str(tiny_models["qwen2"] / "model.safetensors"))
    attn = model.model.layers[2].self_attn
    head_dim = model.config.head_dim
    order = interleave_order(head_dim)

    def rope_rows(t):  # q and k rows: each head's dims pair-interleaved for the rotary
        return t.unflatten(0, (-1, head_dim))[:, order].flatten(0, 1)

    biases = [weights[f"model.layers.2.self_attn.{p}_proj.bias"] for p in "qkv"]
    assert torch.equal(attn.qkv_proj.bias,
                       torch.cat([rope_rows(biases[0]), rope_rows(biases[1]), biases[2]]))
    k_weight = weights["model.layers.2.self_attn.k_proj.weight"]
    q_size = model.config.q_size
    assert torch.equal(attn.qkv_proj.weight[q_size:q_size + k_weight.shape[0]],
                       rope_rows(k_weight))
    gate = weights["model.layers.2.mlp.gate_proj.weight"]
    assert torch.equal(model.model.layers[2].mlp.gate_up_proj.weight[: gate.shape[0]], gate)
    assert model.lm_head is None  # tied to the embeddings


def test_loader_stores_linear_weights_column_major_on_cpu(tiny_models):
    model = load_model(tiny_models["llama"], SdpaAttention(16, torch.device("cpu")))
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            assert module.weight.t().is_contiguous()
    assert model.model.embed_tokens.weight.is_contiguous()  # rows looked up by token id


@pytest.mark.slow
def test_loading_a_model_leaves_torch_compilation_unloaded(tiny_models):
    """An instance never compiles (eager), so loading must not pull in TorchDynamo and, with
    it, Triton: 2 s of every instance's start, and Triton's leak report on every exit."""
    import subprocess
    import sys
    script = ("import sys, torch\n"
              "from engines.models.attention import SdpaAttention\n"
              "from engines.models.loader import load_model\n"
              f"load_model({str(tiny_models['llama'])!r}, SdpaAttention(16, torch.device('cpu')))\n"
              "print(sorted(m for m in ('torch._dynamo', 'triton') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "[]"
    assert "leaked" not in done.stderr


def test_a_model_folder_that_is_not_there_is_named_as_such(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model folder .*/no/such/dir does not exist"):
        Tokenizer(tmp_path / "no" / "such" / "dir")
    (tmp_path / "file").write_text("")
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        Tokenizer(tmp_path / "file")
    with pytest.raises(FileNotFoundError, match="no tokenizer.json in"):
        Tokenizer(tmp_path)

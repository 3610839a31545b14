"""The tiny model's tokenizer: a byte-level BPE trained on a fixed built-in corpus.

Byte-level means every string encodes (256 byte tokens are always in the vocabulary) and
decoding gives the text back exactly. Training is deterministic, so the files written are
the same on every run. The files are the ones Hugging Face expects (`tokenizer.json`,
`tokenizer_config.json`, `special_tokens_map.json`), so `AutoTokenizer` loads the folder
and agrees with our own wrapper token for token.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from engines.models.tiny_corpus import CORPUS

VOCAB_SIZE = 1024
BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (BOS, EOS, *ROLE_TOKENS)

# One turn per message, closed by EOS so a model ends its answer with EOS;
# the rendered text starts with BOS, so encode it without adding another.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


@functools.lru_cache(maxsize=1)
def _trained_json() -> str:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS.splitlines(keepends=True), trainer)
    bos_id = tokenizer.token_to_id(BOS)
    # like Llama 3: BOS in front of every encoded text (HF reads this same processor)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)])
    return tokenizer.to_str(pretty=True)


def build_tokenizer() -> Tokenizer:
    return Tokenizer.from_str(_trained_json())


def token_ids() -> dict[str, int]:
    """Ids of the special tokens (the model's config needs bos/eos)."""
    tokenizer = build_tokenizer()
    return {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_tokenizer_files(out_dir: str | Path, model_max_length: int) -> None:
    out_dir = Path(out_dir)
    (out_dir / "tokenizer.json").write_text(_trained_json(), encoding="utf-8")
    ids = token_ids()
    added = {str(ids[t]): {"content": t, "lstrip": False, "normalized": False,
                           "rstrip": False, "single_word": False, "special": True}
             for t in SPECIAL_TOKENS}
    _write_json(out_dir / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,  # byte-level: nothing is unknown (and Qwen2Tokenizer adds one if unset)
        "additional_special_tokens": list(ROLE_TOKENS),
        "added_tokens_decoder": added,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "model_input_names": ["input_ids", "attention_mask"],
    })
    _write_json(out_dir / "special_tokens_map.json", {
        "bos_token": BOS, "eos_token": EOS, "additional_special_tokens": list(ROLE_TOKENS)})

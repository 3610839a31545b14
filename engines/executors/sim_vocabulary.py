"""The tokens a sim executor emits: the ids of a model's tokenizer that decode, on their
own, to visible text.

Left out: special and EOS/BOS tokens, ids that decode to nothing, and byte pieces of a
multi-byte character (they decode to U+FFFD alone). So every streamed token adds text,
and a client that counts time between chunks sees one chunk per token, as with a model.
"""
from __future__ import annotations

from pathlib import Path

from engines.models.tokenizer import Tokenizer


def text_token_ids(tokenizer: Tokenizer) -> list[int]:
    """Ids, in order, whose decoding is non-empty printable text (no control characters)."""
    skip = set(tokenizer.eos_token_ids) | {tokenizer.bos_token_id}
    ids = []
    for token in range(tokenizer.vocab_size):
        if token in skip:
            continue
        text = tokenizer.decode([token], skip_special_tokens=True)
        if text and text.isprintable() and "\ufffd" not in text:
            ids.append(token)
    if not ids:
        raise ValueError("the tokenizer has no token that decodes to text on its own")
    return ids


def model_text_token_ids(model_dir: str | Path) -> list[int]:
    """`text_token_ids` of the tokenizer in a Hugging Face model folder."""
    return text_token_ids(Tokenizer(model_dir))

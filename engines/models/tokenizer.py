"""A thin tokenizer over a Hugging Face folder's `tokenizer.json` (no transformers import).

Special tokens come from the folder's configs: BOS/EOS names from `tokenizer_config.json`
(or `special_tokens_map.json`), extra EOS ids from `config.json` and
`generation_config.json`. Whether BOS is added is decided by the tokenizer.json
post-processor, exactly as Hugging Face's AutoTokenizer decides it, so both give the same ids.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

from engines.models.model_config import generation_eos_ids


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, character -> byte: printable bytes stand for
    themselves, the others for chr(256 + k) in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
                 *range(ord("\xae"), ord("\xff") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


_BYTE_OF = _byte_level_alphabet()


def _token_name(value: Any) -> str | None:
    """A special token entry is either its text or {"content": text, ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value


class Tokenizer:
    def __init__(self, model_dir: str | Path) -> None:
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            what = "is not a folder" if model_dir.exists() else "does not exist"
            raise FileNotFoundError(f"model folder {model_dir} {what}")
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {model_dir}")
        self._tok = _HFTokenizer.from_file(str(path))
        settings = {**_read_json(model_dir / "special_tokens_map.json"),
                    **_read_json(model_dir / "tokenizer_config.json")}
        self.chat_template: str | None = settings.get("chat_template")
        self.bos_token = _token_name(settings.get("bos_token"))
        self.eos_token = _token_name(settings.get("eos_token"))
        self.bos_token_id = self._id(self.bos_token)
        eos = {self._id(self.eos_token)}
        config_eos = _read_json(model_dir / "config.json").get("eos_token_id")
        eos.update(config_eos if isinstance(config_eos, list) else [config_eos])
        eos.update(generation_eos_ids(model_dir))
        self.eos_token_ids: set[int] = {i for i in eos if i is not None}

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def to_json(self) -> str:
        """The tokenizer as `tokenizer.json` text (what the grammar library reads)."""
        return self._tok.to_str()

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of `text`; `add_bos` adds the special tokens the tokenizer's
        post-processor adds (BOS for Llama-style tokenizers, nothing for Qwen2)."""
        return self._tok.encode(text, add_special_tokens=add_bos).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (OpenAI's logprobs `bytes`), exact even for a
        token that is part of a UTF-8 character: a byte-level BPE token spells each byte
        with one printable character, a byte-fallback token is `<0xNN>`; any other token
        is its text."""
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            return b""
        if type(self._tok.decoder).__name__ == "ByteLevel" and all(c in _BYTE_OF for c in piece):
            return bytes(_BYTE_OF[c] for c in piece)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                return bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
        return self.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None) -> str:
        """The chat rendered as text, as `AutoTokenizer.apply_chat_template` renders it;
        `tools`: OpenAI tool definitions, for templates that render them."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat_template")
        return render_chat(self.chat_template, messages, add_generation_prompt, tools=tools,
                           bos_token=self.bos_token or "", eos_token=self.eos_token or "")

    def encode_chat(self, messages: list[dict[str, str]],
                    add_generation_prompt: bool = True) -> list[int]:
        """Prompt ids for a chat. Templates write BOS themselves, so none is added here
        (the same ids as HF `apply_chat_template(..., tokenize=True)`)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt),
                           add_bos=False)


def render_chat(template: str, messages: list[dict], add_generation_prompt: bool,
                tools: list[dict] | None = None, **specials: str) -> str:
    """As transformers renders chat templates: the same jinja settings, `tojson` without
    HTML escaping or key sorting, `raise_exception` and `strftime_now`."""
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        if tools:
            raise ValueError("rendering tools needs jinja2 on the server") from None
        return _render_without_jinja(template, messages, add_generation_prompt, **specials)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    variables = {"tools": tools} if tools else {}
    return env.from_string(template).render(messages=messages,
                                            add_generation_prompt=add_generation_prompt,
                                            **variables, **specials)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message: str):
    from jinja2.exceptions import TemplateError
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    import datetime
    return datetime.datetime.now().strftime(fmt)


def _render_without_jinja(template, messages, add_generation_prompt, *, bos_token, eos_token):
    """Only the tiny model's own template can be rendered without jinja2."""
    from engines.models.tiny_tokenizer import CHAT_TEMPLATE
    if template != CHAT_TEMPLATE:
        raise RuntimeError("rendering this model's chat template needs jinja2 (pip install jinja2)")
    text = bos_token + "".join(f"<|{m['role']}|>\n{m['content']}{eos_token}\n" for m in messages)
    return text + ("<|assistant|>\n" if add_generation_prompt else "")

"""Request fields this server cannot honour: a 400 naming the field, unless its value
leaves the answer as it would be without it (docs/api.md lists every field).

Three kinds: OpenAI fields the structs declare but we do not implement (`check_supported`:
the deprecated `functions`, audio, reasoning, fill-in-the-middle, best_of > n, prompt
log-probabilities; structured outputs and tools are daemon/structured.py's and
daemon/tool_calls.py's); fields of other servers' dialects -- vLLM's sampling extensions --
that change the answer (`check_undeclared`: refused unless at their neutral value); and
any other field no struct declares, which is ignored and logged once per name, as vLLM
does (clients send extras such as `stream_options` variants freely).
"""
from __future__ import annotations

import logging

import msgspec

from daemon.openai_schema import ChatCompletionRequest, CompletionRequest

log = logging.getLogger(__name__)

#: vLLM's extensions that change the answer -> the values that do not.
FOREIGN_FIELDS: dict[str, tuple] = {
    "min_p": (0, None), "repetition_penalty": (1, None), "min_tokens": (0, None),
    "length_penalty": (1, None), "use_beam_search": (False, None),
    "stop_token_ids": ([], None), "bad_words": ([], None), "allowed_token_ids": (None,),
    "include_stop_str_in_output": (False, None), "skip_special_tokens": (True, None),
    "spaces_between_special_tokens": (True, None), "truncate_prompt_tokens": (None,),
    "prompt_logprobs": (None,), "guided_grammar": (None,),
    "guided_decoding_backend": (None,), "add_special_tokens": (None,),
}
CHAT_FOREIGN_FIELDS: dict[str, tuple] = {
    "echo": (False, None), "add_generation_prompt": (True, None),
    "continue_final_message": (False, None), "chat_template": (None,),
    "chat_template_kwargs": (None, {}), "documents": (None, []),
}
#: Undeclared names already logged (bounded, so a fuzzer cannot grow it without end).
_LOGGED: set[str] = set()
_MAX_LOGGED = 256


def check_undeclared(raw: bytes, kind: type[msgspec.Struct]) -> None:
    """ValueError naming the first foreign field that changes the answer; log the others."""
    try:
        fields = msgspec.json.decode(raw, type=dict[str, msgspec.Raw])
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return  # the struct decoded it: nothing undeclared can be read differently
    foreign = {**FOREIGN_FIELDS, **(CHAT_FOREIGN_FIELDS if kind is ChatCompletionRequest else {})}
    unknown = []
    for name in sorted(fields.keys() - set(kind.__struct_fields__)):
        if name not in foreign:
            unknown.append(name)
        elif not _is_one_of(fields[name], foreign[name]):
            raise ValueError(f"{name}: not supported by this server (it would change the "
                             f"answer); leave it out")
    new = [name for name in unknown if name not in _LOGGED]
    if new and len(_LOGGED) < _MAX_LOGGED:
        _LOGGED.update(new)
        log.warning("ignoring request fields this server does not know: %s", ", ".join(new))


def _is_one_of(raw: msgspec.Raw, neutral: tuple) -> bool:
    try:
        return msgspec.json.decode(raw) in neutral
    except (msgspec.DecodeError, RecursionError):
        return False


def check_supported(body: CompletionRequest | ChatCompletionRequest) -> None:
    """ValueError "field: why" for the first declared field we cannot honour."""
    for field, refused, why in _rules(body):
        if refused:
            raise ValueError(f"{field}: {why}")


def _rules(body):
    if isinstance(body, CompletionRequest):
        yield ("suffix", bool(body.suffix), "not supported (no fill-in-the-middle); leave it empty")
        yield ("best_of", body.best_of not in (None, body.n),
               f"only best_of = n ({body.n}) is supported (no ranking of extra samples)")
        yield ("logprobs", body.echo and body.logprobs is not None,
               "not available with echo: the prompt's log-probabilities are not computed here")
        return
    yield ("top_logprobs", body.top_logprobs is not None and not body.logprobs,
           "needs logprobs: true")
    for i, message in enumerate(body.messages):
        yield (f"messages[{i}].content", message.content is None and not message.tool_calls,
               "only an assistant message with tool_calls may leave out its content")
    yield from _unused("functions", body.functions, "function_call", body.function_call,
                       "function calling")
    yield ("audio", body.audio is not None, "audio output is not supported")
    yield ("modalities", any(m != "text" for m in body.modalities or ()),
           'only ["text"] output is supported')
    yield ("reasoning_effort", body.reasoning_effort is not None,
           "this model does not reason; leave it unset")
    yield ("verbosity", body.verbosity is not None, "not supported; leave it unset")
    yield ("web_search_options", body.web_search_options is not None,
           "web search is not supported")


def _unused(tools_field: str, tools, choice_field: str, choice, what: str):
    """Tools may be sent only if none can be called: no tools (and no forced choice), or
    a choice of "none"."""
    if tools:
        yield (tools_field, choice != "none",
               f"{what} is not supported; send no {tools_field} or {choice_field} \"none\"")
    else:
        yield (choice_field, choice not in (None, "none", "auto"),
               f"there is nothing to call ({what} is not supported)")

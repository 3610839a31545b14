"""Grammar-constrained decoding: which tokens each constrained request may pick next.

The grammar library is llguidance (MIT, microsoft/llguidance; vLLM, SGLang and llama.cpp
ship it too). Chosen over xgrammar because it has no dependencies (xgrammar pulls in
triton, transformers and apache-tvm-ffi), compiles a grammar lazily in about a
millisecond (no per-grammar precomputation, which its MaskBench measures at seconds for
xgrammar on hard schemas), covers more of JSON Schema in JSONSchemaBench, and computes
a whole batch's masks in parallel native threads with the GIL released.

A request's `sampling.grammar` (ipc.params.GrammarSpec) is compiled here, once per
distinct spec (an LRU cache of compiled matchers; each request gets a copy). Its matcher
state is not sent anywhere: it is a function of the tokens the request generated, so it
is rebuilt from them wherever the request runs (an offload, a P/D hand-off, a resume),
and follows them (`sync`): new tokens are consumed, and if the request holds fewer
tokens than the matcher consumed it rolls back. Each step `compute` fills one bitmask
row (32 tokens per int32 word) per constrained request, in numpy (the sim executor
runs without torch); engines/executors/logit_adjust.py's `apply_mask` sets every
disallowed logit of those rows to -inf in one tensor operation for the whole batch, the
same op on CPU and CUDA.
"""
from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass

import llguidance
import numpy as np

from ipc.params import GrammarSpec

log = logging.getLogger(__name__)

#: JSON is generated compact (no free whitespace): a model cannot stall in whitespace.
JSON_OPTIONS = {"whitespace_flexible": False}
#: Distinct compiled grammars kept per model.
CACHE_SIZE = 256


class GrammarError(ValueError):
    """A spec the library cannot compile; the message says why."""


def llguidance_grammar(spec: GrammarSpec) -> str:
    """The spec as llguidance's grammar text; GrammarError when it cannot be read."""
    try:
        if spec.kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(spec.source,
                                                                 defaults=JSON_OPTIONS)
        if spec.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(spec.source)
        if spec.kind == "choice":
            return llguidance.LLMatcher.grammar_from_lark(choice_lark(json.loads(spec.source)))
        return llguidance.LLMatcher.grammar_from_lark(spec.source)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise GrammarError(str(exc)) from None


def choice_lark(options: list[str]) -> str:
    """A Lark grammar matching exactly one of `options`."""
    if not options or not all(isinstance(o, str) for o in options):
        raise GrammarError("a choice is a non-empty list of strings")
    return "start: " + " | ".join(json.dumps(o) for o in options)


@dataclass
class MatcherState:
    """One request's matcher: `seen` of its generated tokens accounted for, the first
    `consumed` of them fed to the matcher (the rest came after the grammar was complete:
    its EOS, and with `ignore_eos` whatever follows, which no grammar reads)."""
    matcher: llguidance.LLMatcher
    consumed: int = 0
    seen: int = 0


class Grammars:
    """One model's grammar machinery: its tokenizer as llguidance reads it, the compiled
    grammars, and the native thread pool that computes a batch's masks."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids,
                 cache_size: int = CACHE_SIZE, threads: int | None = None) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self.tokenizer_json = tokenizer_json
        self._tokenizer: llguidance.LLTokenizer | None = None  # made at first use
        self.words = (vocab_size + 31) // 32
        self._pool = llguidance.LLExecutor(threads)
        self._compiled: OrderedDict[GrammarSpec, llguidance.LLMatcher] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()  # the daemon compiles on a thread pool

    @classmethod
    def for_tokenizer(cls, tokenizer, vocab_size: int | None = None) -> "Grammars":
        """Over an engines.models.tokenizer.Tokenizer; `vocab_size`: the logits' width
        (the model's, maybe over the tokenizer's)."""
        return cls(tokenizer.to_json(), vocab_size or tokenizer.vocab_size,
                   tokenizer.eos_token_ids)

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        """The vocabulary as llguidance reads it, made at first use (about a second for a
        128k vocabulary, so an instance that constrains nothing never pays it)."""
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = llguidance.LLTokenizer(
                    self.tokenizer_json, n_vocab=self.vocab_size,
                    eos_token=self.eos_token_ids or None)
            return self._tokenizer

    # -- compiling ------------------------------------------------------------------------

    def check(self, spec: GrammarSpec) -> None:
        """GrammarError when `spec` cannot be compiled (compiling it caches it)."""
        self._compiled_matcher(spec)

    def matcher(self, spec: GrammarSpec) -> llguidance.LLMatcher:
        """A fresh matcher of `spec` (a copy of the cached compiled one)."""
        return self._compiled_matcher(spec).deep_copy()

    def _compiled_matcher(self, spec: GrammarSpec) -> llguidance.LLMatcher:
        with self._lock:
            found = self._compiled.get(spec)
            if found is not None:
                self._compiled.move_to_end(spec)
                return found
        matcher = llguidance.LLMatcher(self.tokenizer, llguidance_grammar(spec), log_level=0)
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        with self._lock:
            self._compiled[spec] = matcher
            while len(self._compiled) > self._cache_size:
                self._compiled.popitem(last=False)
        return matcher

    # -- each step ------------------------------------------------------------------------

    def sync(self, request) -> llguidance.LLMatcher:
        """The request's matcher, having consumed exactly its generated tokens (up to the
        end of its grammar)."""
        state = request.grammar_state
        if state is None:
            state = request.grammar_state = MatcherState(self.matcher(request.sampling.grammar))
        tokens = request.token_ids  # the generated ones: the last `n` (no copy of them all)
        n = len(tokens) - request.num_prompt_tokens + request.generated_before
        if state.seen > n:  # tokens were taken back: so is the matcher
            if state.consumed > n:
                state.matcher.rollback(state.consumed - n)
                state.consumed = n
            state.seen = n
        if state.seen < n:
            if not state.matcher.is_stopped():
                new = tokens[len(tokens) - (n - state.seen):]
                taken = state.matcher.try_consume_tokens(new)
                state.consumed += taken
                if taken < len(new) and not state.matcher.is_stopped():
                    state.matcher.consume_tokens(new[taken:])  # not allowed: the error says why
            state.seen = n
        return state.matcher

    def compute(self, requests) -> "GrammarMask | None":
        """The masks of the constrained ones of `requests` (a step's sampling rows, in
        order); None when none is constrained."""
        rows = [i for i, r in enumerate(requests) if r.sampling.grammar is not None]
        if not rows:
            return None
        bits = np.zeros((len(rows), self.words), dtype=np.int32)
        matchers, broken = [], []
        for k, i in enumerate(rows):
            try:
                matcher = self.sync(requests[i])
                error = matcher.get_error().split("\n")[0] if matcher.is_error() else ""
            except GrammarError as exc:  # the daemon checks specs: a client of the wire's
                error = str(exc)
            if error:  # it cannot go on: it may only end
                log.warning("request %s: grammar error: %s", requests[i].request_id, error)
                broken.append(k)
            else:
                matchers.append((matcher, k))
        if matchers:
            self._pool.unsafe_compute_mask_ptr(matchers, bits.ctypes.data, self.words * 4,
                                               len(rows))
        flat = bits.view(np.uint8)  # little-endian: bit j of byte b is token 8 b + j
        for k in broken:
            for eos in self.eos_token_ids:
                flat[k, eos // 8] |= np.uint8(1 << (eos % 8))
        return GrammarMask(rows, bits, self.vocab_size)


@dataclass
class GrammarMask:
    """One step's allowed tokens: `bits[k]` for sampling row `rows[k]`."""
    rows: list[int]
    bits: np.ndarray  # [len(rows), words] int32; bit j of word w: token 32 w + j
    vocab_size: int

    def allowed_ids(self, k: int) -> np.ndarray:
        """Row k's allowed token ids, ascending."""
        row = np.unpackbits(self.bits[k].view(np.uint8), bitorder="little")[:self.vocab_size]
        return np.flatnonzero(row)

"""The sim executor: no model. Each batch costs what a latency function says; every
request ends exactly at its max_tokens (or the context limit), never earlier.

The daemon uses it to run without a GPU (overhead benchmarks, tests, third-party load
testers); a simulator can pass a `sleep` that advances a virtual clock instead of waiting.
Its tokens come from `vocabulary`: the daemon gives it the model's text tokens
(engines.executors.sim_vocabulary), so streams carry real text; without one it emits
token 0, which is all a simulator needs. Given the model's grammars (engines/grammar.py),
a constrained request's tokens are drawn from those its grammar allows, and its EOS ends it
once the grammar is complete (no unconstrained request is ever given EOS).
"""
from __future__ import annotations

import time
import zlib
from array import array
from collections.abc import Callable, Sequence

from engines.batch import Batch
from engines.executors.latency import LatencyFn
from engines.request import Request
from ipc.messages import MIN_LOGPROB, TokenLogprobs

_MASK64 = (1 << 64) - 1


class SimExecutor:
    def __init__(self, latency_fn: LatencyFn, num_kv_blocks: int = 4096, block_size: int = 16,
                 max_model_len: int = 4096, sleep: Callable[[float], object] = time.sleep,
                 vocabulary: Sequence[int] = (0,), grammars=None) -> None:
        if not vocabulary:
            raise ValueError("the sim executor needs at least one token id to emit")
        self.latency_fn = latency_fn
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.sleep = sleep
        #: The token ids it emits, each request drawing its own sequence of them.
        self.vocabulary: tuple[int, ...] = tuple(vocabulary)
        #: engines.grammar.Grammars of the model, or None: nothing can be constrained.
        self.grammars = grammars
        #: Only a constrained request is given EOS; others end at max_tokens (or
        #: max_model_len).
        self.eos_token_ids: frozenset[int] = frozenset(grammars.eos_token_ids if grammars else ())
        self.vocab_size = None  # it runs no model: any prompt id will do
        self.device = None
        self.carries_kv = False
        self.busy_time = 0.0  # total latency charged so far, seconds

    def export_kv(self, block_table: list[int], num_tokens: int) -> tuple[None, list]:
        """No KV to move: a simulated hand-off carries only the request."""
        return None, []

    def import_kv(self, block_table: list[int], layout, frames: list) -> None:
        """Nothing arrives (see export_kv)."""

    def execute(self, batch: Batch) -> list[int]:
        seconds = self.latency(batch)
        if seconds > 0.0:
            self.sleep(seconds)
        return self.tokens(batch)

    def latency(self, batch: Batch) -> float:
        """What `batch` costs (charged to `busy_time`); a simulator schedules its end."""
        seconds = self.latency_fn(batch)
        self.busy_time += max(seconds, 0.0)
        return seconds

    def tokens(self, batch: Batch) -> list[int]:
        """The sampled tokens of `batch`, without running anything. Sampling parameters
        (temperature, penalties, bias) change nothing; a request asking for logprobs
        gets those of a certain choice (see `_certain`)."""
        requests = batch.sampling_requests()
        vocabulary = self.vocabulary
        if len(vocabulary) == 1:
            # A simulator's: one token for every request, but those with stop tokens or
            # logprobs (looked at one by one below). One list, not a call per token.
            tokens = [vocabulary[0]] * len(requests)
            special = [i for i, r in enumerate(requests)
                       if r.sampling.stop_token_ids or r.sampling.logprobs is not None]
        else:
            tokens = [0] * len(requests)
            special = range(len(requests))
        for i in special:
            request = requests[i]
            tokens[i] = token = self._token_for(request)
            if request.sampling.logprobs is not None:
                request.sampled_logprobs = self._certain(token, request.sampling.logprobs)
        if any(r.sampling.grammar is not None for r in requests):
            self._constrain(requests, tokens)
        return tokens

    def _constrain(self, requests: list[Request], tokens: list[int]) -> None:
        """Replace each constrained request's token by one its grammar allows, picked by
        its seed (else prompt) and position as `_token_for` picks."""
        if self.grammars is None:
            raise ValueError("this sim executor has no tokenizer (model_dir): no output "
                             "can be constrained")
        mask = self.grammars.compute(requests)
        for k, i in enumerate(mask.rows):
            allowed = mask.allowed_ids(k)
            request = requests[i]
            tokens[i] = int(allowed[_mix(_request_key(request), request.num_tokens)
                                    % len(allowed)])

    def _certain(self, token: int, k: int) -> TokenLogprobs:
        """Its token had probability 1 (logprob 0); the k - 1 alternatives listed after it
        had none (MIN_LOGPROB): the next vocabulary tokens."""
        others = [t for t in self.vocabulary[:k + 1] if t != token][:max(k - 1, 0)]
        top = [token, *others][:k]
        return TokenLogprobs(0.0, top, [0.0] + [MIN_LOGPROB] * (len(top) - 1) if top else [])

    def _token_for(self, request: Request) -> int:
        """A vocabulary token picked by the request's seed (else its prompt) and position,
        so a request gets the same text every run; never one of its stop tokens."""
        vocabulary, stops = self.vocabulary, request.sampling.stop_token_ids
        if len(vocabulary) == 1 and not stops:  # a simulator's: no text needed
            return vocabulary[0]
        at = _mix(_request_key(request), request.num_tokens) % len(vocabulary)
        for step in range(len(vocabulary)):
            token = vocabulary[(at + step) % len(vocabulary)]
            if token not in stops:
                return token
        token = vocabulary[at]  # every vocabulary token is a stop token: step past them
        while token in stops:
            token += 1
        return token


def _request_key(request: Request) -> int:
    """The request's seed, else a stable hash of its prompt (kept on the request): the same
    prompt gets the same text, as greedy decoding gives."""
    if request.sampling.seed is not None:
        return request.sampling.seed & _MASK64
    if request.rng is None:
        request.rng = zlib.crc32(array("q", request.prompt_token_ids).tobytes())
    return request.rng


def _mix(key: int, position: int) -> int:
    """splitmix64 of (key, position): well spread, the same in every process."""
    x = (key * 0x9E3779B97F4A7C15 + position) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)

"""vLLM's `stream_options.continuous_usage_stats` (guidellm sends it): every chunk of a
stream carries the usage so far, not only the last one.

Covers: daemon/stream_events.py, daemon/response_streamer.py.
"""
from __future__ import annotations

import pytest

from tests.api_fakes import CHAT
from tests.test_api_openai import post_stream


@pytest.mark.parametrize("path,body", [("/v1/completions", {"prompt": "Hi"}),
                                       ("/v1/chat/completions", {"messages": CHAT})])
async def test_every_chunk_counts_the_tokens_so_far(client, path, body):
    chunks = await post_stream(client, path, {**body, "max_tokens": 3, "stream_options": {
        "include_usage": True, "continuous_usage_stats": True}})
    *content, last = chunks
    assert [c["usage"]["completion_tokens"] for c in content] == [1, 2, 3]
    prompt = content[0]["usage"]["prompt_tokens"]
    assert prompt > 0 and all(c["usage"]["prompt_tokens"] == prompt for c in content)
    assert all(c["usage"]["total_tokens"] == prompt + c["usage"]["completion_tokens"]
               for c in content)
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 3


async def test_without_it_only_the_last_chunk_has_usage(client):
    chunks = await post_stream(client, "/v1/completions", {
        "prompt": "Hi", "max_tokens": 3, "stream_options": {"include_usage": True}})
    assert ["usage" in c for c in chunks] == [False, False, False, True]

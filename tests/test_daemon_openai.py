"""End to end through the official `openai` client on the real daemon (torch executor,
tiny model, CPU): log-probabilities checked against transformers, n > 1 with seeds,
batches of prompts, echo, GET /v1/models/{id}, `--max-model-len` and the context limit;
and the sim executor's log-probabilities and context length.

Covers: daemon/api.py, daemon/logprobs.py.
"""
from __future__ import annotations

import json

import openai
import pytest
import torch

from daemon.logprobs import TokenText
from tests.daemon_fixture import sim_args, start_daemon, torch_args

pytestmark = pytest.mark.slow

MODEL = "tiny"
MAX_MODEL_LEN = 256
PROMPTS = ["Hello, Ascendra", "Paged attention is"]
CHAT = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, daemon_cache, tiny_models):
    d = start_daemon(tmp_path_factory.mktemp("openai-daemon"), "--model", str(tiny_models["llama"]),
                     # the API, not scheduling, is under test: a baseline that queues, where
                     # the default 1A sheds what it predicts will miss 1 s on a busy CPU
                     *torch_args(), "--layout", "1xsarathi", "--served-model-name", MODEL,
                     "--max-model-len", str(MAX_MODEL_LEN), cache_dir=daemon_cache)
    yield d
    d.close()


@pytest.fixture(scope="module")
def client(daemon):
    c = openai.OpenAI(base_url=daemon.base_url + "/v1", api_key="unused", max_retries=0,
                      timeout=60)
    yield c
    c.close()


@pytest.fixture(scope="module")
def hf_model(tiny_models):
    transformers = pytest.importorskip("transformers")  # here: not at collection
    return transformers.AutoModelForCausalLM.from_pretrained(
        tiny_models["llama"], dtype=torch.float32).eval()


def greedy_reference(model, prompt_ids: list[int], num: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens (EOS ignored) and the log-softmax each was chosen from."""
    ids, logprobs = list(prompt_ids), []
    with torch.no_grad():
        for _ in range(num):
            row = model(torch.tensor([ids])).logits[0, -1].float().log_softmax(-1)
            logprobs.append(row)
            ids.append(int(row.argmax()))
    return ids[len(prompt_ids):], logprobs


# ---- log-probabilities ----------------------------------------------------------------

def test_completion_logprobs_are_the_models(client, tokenizer, hf_model):
    ids, reference = greedy_reference(hf_model, tokenizer.encode(PROMPTS[0]), 8)
    resp = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=8, temperature=0,
                                     logprobs=3, extra_body={"ignore_eos": True})
    logprobs, text = resp.choices[0].logprobs, TokenText(tokenizer)
    assert logprobs.tokens == [text.text(i) for i in ids]
    assert logprobs.token_logprobs == pytest.approx([r[i].item() for r, i in zip(reference, ids)],
                                                    abs=1e-3)
    for top, row in zip(logprobs.top_logprobs, reference):
        best = row.topk(3)
        want = {text.text(int(i)): v.item() for v, i in zip(best.values, best.indices)}
        assert top == pytest.approx(want, abs=1e-3)  # greedy: the chosen token is the top one
    offsets = [0]
    for token in logprobs.tokens[:-1]:
        offsets.append(offsets[-1] + len(token))
    assert logprobs.text_offset == offsets


def test_streamed_chat_logprobs_are_the_models(client, tokenizer, hf_model):
    ids, reference = greedy_reference(hf_model, tokenizer.encode_chat(CHAT), 6)
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2,
        stream=True, extra_body={"ignore_eos": True}))
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs
               for e in c.choices[0].logprobs.content]
    assert len(entries) == 6
    for entry, token, row in zip(entries, ids, reference):
        assert bytes(entry.bytes) == tokenizer.token_bytes(token)
        assert entry.logprob == pytest.approx(row[token].item(), abs=1e-3)
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(row.topk(2).values.tolist(),
                                                                        abs=1e-3)
        assert entry.top_logprobs[0].token == entry.token
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert b"".join(bytes(e.bytes) for e in entries).decode() == text


# ---- n, batches, echo -------------------------------------------------------------------

def test_n_and_a_batch_of_prompts(client, tokenizer):
    kwargs = dict(model=MODEL, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    resp = client.completions.create(prompt=PROMPTS, n=2, **kwargs)
    texts = [c.text for c in resp.choices]
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    assert texts[0] == texts[1] != texts[2] == texts[3]  # greedy: each prompt's n agree
    assert texts[2] == client.completions.create(prompt=PROMPTS[1], **kwargs).choices[0].text
    assert resp.usage.prompt_tokens == sum(len(tokenizer.encode(p)) for p in PROMPTS)
    assert resp.usage.completion_tokens == 4 * 6


def test_sample_i_of_a_seeded_request_uses_seed_plus_i(client):
    kwargs = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=12, temperature=1.0,
                  extra_body={"ignore_eos": True})
    three = [c.text for c in client.completions.create(n=3, seed=11, **kwargs).choices]
    assert three == [c.text for c in client.completions.create(n=3, seed=11, **kwargs).choices]
    assert len(set(three)) > 1
    assert client.completions.create(seed=12, **kwargs).choices[0].text == three[1]


def test_streamed_choices_carry_their_index(client):
    full = client.chat.completions.create(model=MODEL, messages=CHAT, n=2, max_tokens=8,
                                          temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, n=2, max_tokens=8,
                                                 temperature=0, stream=True))
    for choice in full.choices:
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == choice.index]
        assert "".join(m.delta.content or "" for m in mine) == choice.message.content
        assert mine[0].delta.role == "assistant" and mine[-1].finish_reason is not None


def test_echo_puts_the_prompt_first(client):
    plain = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=4, temperature=0)
    echoed = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=4, temperature=0,
                                       echo=True)
    assert echoed.choices[0].text == PROMPTS[0] + plain.choices[0].text


# ---- models and the context -------------------------------------------------------------

def test_one_model_by_id_and_its_context(client):
    model = client.models.retrieve(MODEL)
    assert model.id == MODEL and model.model_extra["max_model_len"] == MAX_MODEL_LEN
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-4o")
    assert "gpt-4o" in info.value.message


def test_max_tokens_must_fit_the_context_unless_unset(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=[5] * 250, max_tokens=10)
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in info.value.message
    assert info.value.param == "max_tokens"
    resp = client.completions.create(model=MODEL, prompt=[5] * 250,
                                     extra_body={"ignore_eos": True})
    assert resp.usage.completion_tokens == MAX_MODEL_LEN - 250


# ---- the sim executor -------------------------------------------------------------------

def test_sim_executor_reports_the_models_context_and_certain_logprobs(daemon_factory, tiny_models):
    daemon = daemon_factory(*sim_args())
    status, models = daemon.get_json("/v1/models")
    config = json.loads((tiny_models["llama"] / "config.json").read_text())
    assert status == 200 and models["data"][0]["max_model_len"] == config["max_position_embeddings"]
    status, body = daemon.post_json("/v1/completions", {"prompt": "Hi", "max_tokens": 3,
                                                        "logprobs": 2, "temperature": 1.5,
                                                        "logit_bias": {"5": -100}})
    assert status == 200, body
    logprobs = body["choices"][0]["logprobs"]
    assert logprobs["token_logprobs"] == [0.0] * 3
    assert all(sorted(top.values()) == [-9999.0, 0.0] for top in logprobs["top_logprobs"])

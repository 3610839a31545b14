"""The rank processes of the ESP parity tests (tests/test_sequence_parallel.py): each loads
the whole tiny model with `EspAttention`, forms the group at a store path (no default
torch.distributed group: as independent instance processes would), prefills its stripe of
the prompt and follows the greedy decode with `master` owning the query; the master writes
the tokens and every step's logits to a safetensors file."""
from __future__ import annotations

import torch

NUM_BLOCKS = 160
BLOCK_SIZE = 16


def run_rank(rank: int, size: int, store_path: str, model_dir: str, prompt: list[int],
             max_tokens: int, master: int, out_path: str) -> None:
    from safetensors.torch import save_file

    from engines.models.attention import SdpaAttention
    from engines.models.esp_sequence import EspSequence
    from engines.models.loader import load_model
    from engines.models.sequence_parallel import EspAttention, EspGroup

    torch.set_num_threads(1)
    group = EspGroup.form(store_path, rank, size)
    model = load_model(model_dir, EspAttention(SdpaAttention(BLOCK_SIZE, torch.device("cpu"))))
    config = model.config
    shape = (NUM_BLOCKS, BLOCK_SIZE, config.num_key_value_heads, config.head_dim)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(config.num_hidden_layers)]
    sequence = EspSequence(group, list(range(NUM_BLOCKS)), BLOCK_SIZE)
    first = sequence.prefill(model, caches, prompt)
    owner = (len(prompt) - 1) % size
    logits = group.broadcast(first if rank == owner else torch.empty(config.vocab_size), owner)
    rows, tokens = [logits.clone()], [int(logits.argmax())]
    for _ in range(max_tokens - 1):
        step = sequence.decode(model, caches, tokens[-1], master)
        token = torch.tensor([int(step.argmax()) if rank == master else 0])
        tokens.append(int(group.broadcast(token, master)))
        if rank == master:
            rows.append(step.clone())
    if rank == master:
        save_file({"logits": torch.stack(rows), "tokens": torch.tensor(tokens),
                   "held": torch.tensor([sequence.held])}, out_path)


def run_rank_gathered(rank: int, size: int, store_path: str, model_dir: str,
                      prompt: list[int], max_tokens: int, master: int, out_path: str,
                      chunk: int = 0) -> None:
    """As `run_rank`, but scaled down by moving the KV: after the prefill every stripe goes
    to the master (`EspSequence.gather_to`), which then decodes alone with its ordinary
    paged attention over blocks of its own. `chunk`: the prefill in chunks of that many
    positions (as the instance core cuts a group's prefill), 0: one step."""
    from safetensors.torch import save_file

    from engines.models.attention import SdpaAttention, SeqSpec
    from engines.models.esp_sequence import EspSequence
    from engines.models.loader import load_model
    from engines.models.sequence_parallel import EspAttention, EspGroup

    torch.set_num_threads(1)
    group = EspGroup.form(store_path, rank, size)
    paged = SdpaAttention(BLOCK_SIZE, torch.device("cpu"))
    model = load_model(model_dir, EspAttention(paged))
    config = model.config
    shape = (NUM_BLOCKS, BLOCK_SIZE, config.num_key_value_heads, config.head_dim)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(config.num_hidden_layers)]
    stripe_blocks = NUM_BLOCKS // 4                      # a third of the prompt fits
    sequence = EspSequence(group, list(range(stripe_blocks)), BLOCK_SIZE)
    ends = list(range(chunk, len(prompt), chunk)) if chunk else []
    for begin, end in zip([0, *ends], [*ends, len(prompt)]):
        first = sequence.prefill(model, caches, prompt, begin, end)
    owner = (len(prompt) - 1) % size
    logits = group.broadcast(first if rank == owner else torch.empty(config.vocab_size), owner)
    table = list(range(stripe_blocks, NUM_BLOCKS))       # the master's blocks of the request
    sequence.gather_to(caches, master, table if rank == master else None)
    if rank != master:
        return
    rows, tokens = [logits.clone()], [int(logits.argmax())]
    with torch.inference_mode():
        for position in range(len(prompt), len(prompt) + max_tokens - 1):
            meta = paged.build([SeqSpec(position, 1, table)])
            step = model(torch.tensor(tokens[-1:]), torch.tensor([position]), caches, meta,
                         torch.tensor([0]))[0]
            rows.append(step.clone())
            tokens.append(int(step.argmax()))
    save_file({"logits": torch.stack(rows), "tokens": torch.tensor(tokens),
               "held": torch.tensor([sequence.held])}, out_path)

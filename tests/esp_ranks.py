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

"""Which executor an instance runs: its settings and their defaults (built by
engines/executors/build.py). Imports no executor: torch stays unloaded on the sim path."""
from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

PositiveInt = Annotated[int, Meta(ge=1)]

#: KV capacity of a sim executor when the config does not say.
SIM_DEFAULT_KV_BLOCKS = 4096
#: torch on CUDA: decode steps of up to this many sequences replay captured CUDA graphs
#: (vLLM captures up to 512 by default; 256 is our default max_num_seqs' ceiling).
DEFAULT_CUDA_GRAPH_MAX_BATCH = 256
#: torch: threads of the executor's process (torch.set_num_threads); 0 = torch's own choice
#: (OMP_NUM_THREADS if set, else one per core).
DEFAULT_TORCH_THREADS = 0
#: Context limit of a sim executor that has no model folder to read it from.
SIM_DEFAULT_MAX_MODEL_LEN = 4096


class ExecutorConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    kind: Literal["torch", "sim"] = "sim"
    block_size: PositiveInt = 16
    #: KV cache size in blocks. torch: None sizes it from free memory; sim: None = 4096.
    num_kv_blocks: PositiveInt | None = None
    #: Hugging Face model folder. torch: the model, "" = the built-in tiny model; sim: its
    #: tokenizer's text tokens are what it emits, "" = no tokenizer, it emits token 0.
    model_dir: str = ""
    #: torch: "cpu" | "cuda" | "cuda:N"; "" = cuda when available.
    device: str = ""
    #: sim: latency function spec, see engines.executors.latency ("zero", "constant:0.01").
    latency: str = "zero"
    #: The context limit of one request, for both kinds; None = the model's (its
    #: config.json: max_position_embeddings, capped at a sliding window); a sim without
    #: a model folder: SIM_DEFAULT_MAX_MODEL_LEN. torch refuses more than the model's.
    max_model_len: PositiveInt | None = None
    #: torch on CUDA: the largest decode batch run by CUDA graph replay; 0 = every step
    #: runs eagerly (vLLM's --enforce-eager).
    cuda_graph_max_batch: Annotated[int, Meta(ge=0)] = DEFAULT_CUDA_GRAPH_MAX_BATCH
    #: Tensor-parallel degree: the instance runs the model over this many ranks, one
    #: process and (on CUDA) one GPU each (engines/tp_ranks.py). sim: the profile's
    #: step times at this degree.
    tp: PositiveInt = 1
    #: torch: this process's threads (a TP rank's too); 0 = torch's default (one per
    #: core, or OMP_NUM_THREADS), or at tp > 1 on CPU the cores shared out over the ranks.
    torch_threads: Annotated[int, Meta(ge=0)] = DEFAULT_TORCH_THREADS
    #: torch: a measured profile (`ascendra profile`'s file) of this executor that the
    #: performance model starts from instead of timing batches at start; "" = calibrate.
    perf_profile: str = ""
    #: torch: this instance may join ESP groups (controller.esp_max_degree > 1), so its
    #: attention also runs ESP steps; off, the step's attention is the backend alone.
    esp: bool = False

"""The real executor: a Llama-family torch model over a paged KV cache.

Each step flattens the batch's chunks into one token sequence (one-token chunks first,
then longest context first: the layout the attention backend wants), runs one forward
pass that writes every chunk's K/V into its request's blocks, and samples one token for
each chunk that reaches its request's newest token, returned in `batch.chunks` order.
On CUDA a step of decodes only replays a captured CUDA graph instead
(engines/executors/decode_graphs.py). A constrained request's allowed tokens
(engines/grammar.py) are computed on a worker thread while the forward pass runs, and
applied to the whole batch's logits at once before sampling.

Under tensor parallelism (`shard`, engines/models/tensor_parallel.py) this executor holds
one rank's shard and KV heads. Rank 0's has `ranks` (engines/tp_ranks.py): each step it
sends the step's sequences to the other ranks, which run the same forward pass on their
shards (the row-parallel layers' all-reduces meet); only rank 0 samples. Decode graphs
are not captured then (their replay would need the all-reduce captured too).
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from engines.batch import Batch
from engines.executors.executor_config import DEFAULT_CUDA_GRAPH_MAX_BATCH
from engines.executors.sampler import Sampler
from engines.grammar import Grammars
from engines.models.attention import SeqSpec, select_attention
from engines.models.model_config import ModelConfig, generation_eos_ids
from engines.models.loader import default_dtype, load_model
from engines.models.kv_transfer import export_blocks, import_blocks
from engines.models.tokenizer import Tokenizer
from engines.models.esp_sequence import EspSequence
from engines.models.sequence_parallel import EspAttention, EspGroup
from engines.models.tensor_parallel import Shard
from engines.tp_wire import StepSeq

log = logging.getLogger(__name__)

CPU_KV_CACHE_BYTES = 256 * 2**20
#: From this many constrained rows in a step their masks are computed on the mask thread.
MASK_THREAD_MIN_ROWS = 8


@dataclass
class StepInput:
    input_ids: torch.Tensor       # [tokens]
    positions: torch.Tensor       # [tokens]
    meta: object                  # the attention backend's per-step metadata
    logits_indices: torch.Tensor  # [sampling chunks] rows to sample, in batch order
    sampling: list                # the requests of those rows


class TorchExecutor:
    carries_kv = True  # export_kv/import_kv move the real cache (P/D hand-offs)

    def __init__(self, model_dir: str | Path, *, block_size: int = 16,
                 num_kv_blocks: int | None = None, device: str | torch.device | None = None,
                 dtype: torch.dtype | None = None, kv_cache_memory_fraction: float = 0.9,
                 cpu_kv_cache_bytes: int = CPU_KV_CACHE_BYTES,
                 num_threads: int | None = None, max_model_len: int | None = None,
                 cuda_graph_max_batch: int = DEFAULT_CUDA_GRAPH_MAX_BATCH,
                 shard: Shard = Shard(), ranks=None, esp: bool = False) -> None:
        if num_threads:
            torch.set_num_threads(num_threads)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.config = config = ModelConfig.from_pretrained(model_dir)
        self.dtype = dtype or default_dtype(config, self.device)
        self.block_size = block_size
        #: this process's rank of the instance's tensor-parallel group, and (rank 0 of
        #: several) the other ranks it drives (engines/tp_ranks.py)
        self.shard, self.ranks = shard, ranks
        self.num_kv_heads = len(shard.kv_heads(config))
        self.attention = select_attention(self.device, self.dtype, block_size)
        if esp and self.device.type == "cpu" and not shard.parallel:  # ESP groups: gloo
            self.attention = EspAttention(self.attention)
        self.model = load_model(model_dir, self.attention, config=config, device=self.device,
                                dtype=self.dtype, shard=shard)
        #: The context limit: the model's (config.json), or less when asked.
        self.max_model_len = config.max_model_len if max_model_len is None else max_model_len
        if not 0 < self.max_model_len <= config.max_model_len:
            raise ValueError(f"max_model_len {self.max_model_len} must be 1..{config.max_model_len}"
                             f" (the model's context length)")
        self.eos_token_ids = frozenset(config.eos_token_ids) | frozenset(
            generation_eos_ids(model_dir))
        #: decode steps replay CUDA graphs (engines/executors/decode_graphs.py) where the
        #: attention backend reads the paged cache in place
        self.uses_graphs = (cuda_graph_max_batch > 0 and self.device.type == "cuda"
                            and self.attention.name == "triton-paged" and not shard.parallel)
        self.num_kv_blocks = num_kv_blocks or self._auto_num_blocks(kv_cache_memory_fraction,
                                                                    cpu_kv_cache_bytes)
        if shard.parallel and num_kv_blocks is None:  # every rank: the smallest rank's
            from engines.tp_group import smallest
            self.num_kv_blocks = smallest(shard, self.num_kv_blocks)
        self.kv_caches = self._allocate_kv_cache()
        self.sampler = Sampler()
        #: None for a model folder without tokenizer.json (nothing can be constrained)
        self.grammars = (Grammars(Tokenizer(model_dir).to_json(), config.vocab_size,
                                  self.eos_token_ids)
                         if (Path(model_dir) / "tokenizer.json").is_file() else None)
        self._mask_thread = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
        self.graphs = self._capture_graphs(cuda_graph_max_batch) if self.uses_graphs else None
        log.info("torch executor: %s%s on %s (%s), attention %s, %d KV blocks of %d tokens, %s",
                 config.model_type,
                 f" rank {shard.rank} of tp {shard.size}" if shard.parallel else "",
                 self.device, self.dtype, self.attention.name,
                 self.num_kv_blocks, block_size,
                 f"decode graphs up to batch {self.graphs.max_batch}" if self.graphs else "eager")

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    # -- KV cache -------------------------------------------------------------------------

    @property
    def kv_block_bytes(self) -> int:
        c = self.config
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * c.num_hidden_layers * self.block_size * self.num_kv_heads * c.head_dim * elem

    def _auto_num_blocks(self, fraction: float, cpu_bytes: int) -> int:
        """CUDA: `fraction` of the memory still free after the weights; CPU: a fixed budget."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = int(free * fraction)
        else:
            budget = cpu_bytes
        blocks = budget // self.kv_block_bytes - int(self.uses_graphs)  # and a padding block
        if blocks < 1:
            raise RuntimeError(f"no memory left for the KV cache ({budget} bytes)")
        return blocks

    def _allocate_kv_cache(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """`num_kv_blocks` blocks for requests, and with CUDA graphs one more that no
        request owns: where a captured decode step writes the K/V of its padding rows."""
        c = self.config
        shape = (self.num_kv_blocks + int(self.uses_graphs), self.block_size, self.num_kv_heads,
                 c.head_dim)
        return [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                 torch.zeros(shape, dtype=self.dtype, device=self.device))
                for _ in range(c.num_hidden_layers)]

    def recapture_graphs(self) -> None:
        """Capture the decode graphs again, after the model's kernels changed (benchmarks
        comparing kernel choices on one loaded model)."""
        if self.graphs is not None:
            max_batch, self.graphs = self.graphs.max_batch, None
            torch.cuda.empty_cache()
            self.graphs = self._capture_graphs(max_batch)

    def _capture_graphs(self, max_batch: int):
        from engines.executors.decode_graphs import DecodeGraphs  # Triton: CUDA only
        graphs = DecodeGraphs(self.model, self.kv_caches, max_batch=max_batch,
                              max_model_len=self.max_model_len, block_size=self.block_size,
                              pad_block=self.num_kv_blocks, device=self.device, dtype=self.dtype)
        graphs.capture()
        return graphs

    # -- P/D hand-offs (engines/handoff.py) -------------------------------------------------

    def export_kv(self, block_table: list[int], num_tokens: int):
        """(KvLayout, one frame per layer): the first `num_tokens` tokens' KV of a request
        (under tensor parallelism: every KV head, gathered from the ranks)."""
        if self.ranks is not None:
            return self.ranks.export_kv(self, block_table, num_tokens)
        return export_blocks(self.kv_caches, block_table, num_tokens, self.block_size)

    def import_kv(self, block_table: list[int], layout, frames) -> None:
        """Write KV exported by `export_kv` (maybe another process's, maybe at another
        tensor-parallel degree) into `block_table`."""
        if self.ranks is not None:
            return self.ranks.import_kv(self, block_table, layout, frames)
        import_blocks(self.kv_caches, block_table, layout, frames, self.block_size)

    # -- ESP groups (engines/esp_parts.py) ---------------------------------------------------

    def esp_prefill(self, step, group: EspGroup,
                    sequence: EspSequence | None = None) -> EspSequence:
        """This instance's part of one chunk of an ESP group's prefill (an `EspStep`) in
        `group`: its stripe of the chunk's positions, into the step's blocks, after the
        chunks `sequence` ran (None: the first). Raises RuntimeError when a member is gone
        or silent past the group's timeout (gloo)."""
        if not isinstance(self.attention, EspAttention):
            raise RuntimeError("this instance was not built for ESP groups (esp: "
                               "controller.esp_max_degree > 1, on CPU, without tensor "
                               "parallelism)")
        if sequence is None:
            sequence = EspSequence(group, step.block_table, self.block_size)
        sequence.prefill(self.model, self.kv_caches, step.token_ids, step.begin, step.stop)
        return sequence

    def esp_gather(self, step, sequence: EspSequence) -> None:
        """Then every stripe into the master's blocks, in position order: the master
        decodes the request alone from here (engines/models/esp_sequence.py)."""
        sequence.gather_to(self.kv_caches, 0, step.block_table if step.master else None)

    # -- one step -------------------------------------------------------------------------

    def _check(self, seq: StepSeq) -> None:
        needed = -(-seq.context_len // self.block_size)
        if len(seq.block_table) < needed:
            raise ValueError(f"{seq}: needs {needed} KV blocks, request holds "
                             f"{len(seq.block_table)}")
        if seq.context_len > self.max_model_len:
            raise ValueError(f"{seq}: context {seq.context_len} exceeds max_model_len "
                             f"{self.max_model_len}")

    def prepare(self, batch: Batch) -> StepInput:
        seqs = [StepSeq.of(chunk) for chunk in batch.chunks]
        if self.ranks is not None:
            self.ranks.send_step(seqs)
        step = self.prepare_seqs(seqs)
        step.sampling = [c.request for c in batch.chunks if c.samples]
        return step

    def prepare_seqs(self, seqs: list[StepSeq], sample: bool = True) -> StepInput:
        """The step's tensors; `sample` False: no row is sampled (ranks other than 0)."""
        # one-token chunks first, then longest context first: the attention backend
        # batches chunks of similar (decodes) or equal (fresh prefills) length in one call
        ordered = sorted(seqs, key=lambda c: (c.num_tokens != 1, -c.context_len))
        ids: list[int] = []
        positions: list[int] = []
        row_end: dict[int, int] = {}
        for seq in ordered:
            self._check(seq)
            ids.extend(seq.token_ids)
            positions.extend(range(seq.start, seq.context_len))
            row_end[id(seq)] = len(ids) - 1
        specs = [SeqSpec(c.start, c.num_tokens, c.block_table) for c in ordered]
        rows = [row_end[id(c)] for c in seqs if c.samples] if sample else []
        to = dict(device=self.device, non_blocking=True)
        return StepInput(
            input_ids=torch.tensor(ids, dtype=torch.long).to(**to),
            positions=torch.tensor(positions, dtype=torch.long).to(**to),
            meta=self.attention.build(specs),
            logits_indices=torch.tensor(rows, dtype=torch.long).to(**to),
            sampling=[],
        )

    @torch.inference_mode()
    def run_seqs(self, seqs: list[StepSeq]) -> None:
        """A rank other than 0: rank 0's step on this shard (its K/V written, nothing sampled)."""
        step = self.prepare_seqs(seqs, sample=False)
        self.model(step.input_ids, step.positions, self.kv_caches, step.meta,
                   step.logits_indices)

    def _replay_decodes(self, batch: Batch) -> tuple[torch.Tensor, list] | None:
        """A batch of one-token chunks that a captured graph holds: its sampling chunks'
        logits by graph replay; None for any other batch."""
        chunks = batch.chunks
        if (self.graphs is None or not self.graphs.fits(len(chunks))
                or any(c.num_tokens != 1 for c in chunks)):
            return None
        for chunk in chunks:
            self._check(StepSeq.of(chunk))
        seqs = [SeqSpec(c.start, 1, c.request.block_table) for c in chunks]
        logits = self.graphs.run([c.request.token_ids[c.start] for c in chunks], seqs)
        rows = [i for i, c in enumerate(chunks) if c.samples]
        if len(rows) < len(chunks):
            logits = logits[torch.tensor(rows, device=self.device)]
        return logits, [chunks[i].request for i in rows]

    @torch.inference_mode()
    def compute_logits(self, batch: Batch) -> tuple[torch.Tensor, list]:
        """Run the forward pass of `batch`; the logits of its sampling chunks, in order."""
        replayed = self._replay_decodes(batch)
        if replayed is not None:
            return replayed
        step = self.prepare(batch)
        logits = self.model(step.input_ids, step.positions, self.kv_caches, step.meta,
                            step.logits_indices)
        return logits, step.sampling

    def _start_masks(self, batch: Batch):
        """The batch's grammar masks: a future computing them on the mask thread while the
        forward pass runs; with few constrained rows, a plain function run after it (the
        thread hand-off costs more than their masks; on CUDA the forward runs
        asynchronously anyway). None: nothing constrained."""
        requests = batch.sampling_requests()
        constrained = sum(r.sampling.grammar is not None for r in requests)
        if not constrained:
            return None
        if self.grammars is None:
            raise ValueError(f"{self.config.model_type}: no tokenizer.json in the model folder,"
                             " so no output can be constrained")
        if constrained < MASK_THREAD_MIN_ROWS:
            return lambda: self.grammars.compute(requests)
        return self._mask_thread.submit(self.grammars.compute, requests).result

    @torch.inference_mode()
    def execute(self, batch: Batch) -> list[int]:
        if not batch.chunks:
            return []
        masks = self._start_masks(batch)
        logits, requests = self.compute_logits(batch)
        if not requests:
            return []
        return self.sampler(logits, requests, masks() if masks is not None else None)

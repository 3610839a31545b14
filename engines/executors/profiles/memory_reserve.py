"""The GPU memory vLLM keeps out of the KV cache besides the weights: the activation peak of
its profiling forward pass and the CUDA graphs.

vLLM sizes the KV cache after one dummy forward pass of `max_num_batched_tokens` tokens
spread over `max_num_seqs` sequences (vllm-project/vllm, V0 `Worker.
determine_num_available_blocks` -> `ModelRunner.profile_run`; V1 `Worker.
determine_available_memory`): the pass's peak memory above the weights is kept free.
We model that peak from the model's shape (e bytes per element, T tokens, S sequences,
H hidden, I intermediate, V vocabulary):

    activation = e T (3 I + 3 H)      the decoder layer's largest live set, in its MLP:
                                      the fused gate/up output [T, 2I], its SiLU-and-mul
                                      output [T, I], the down projection's output, the
                                      residual stream and the layer input ([T, H] each)
               + 3 x 4 S V            the sampler's fp32 logits, probabilities and
                                      log-probabilities for the S rows that sample
                                      (vLLM V0's Sampler keeps all three in float32)

(attention's q/k/v and output, [T, q + 2 kv] and [T, q], are smaller and freed before
the MLP). Llama-3-8B at vLLM's defaults (T = 8192, S = 256): 0.84 + 0.37 = 1.21 GiB. vLLM
reports "PyTorch activation peak memory 1.26GiB" for `vllm serve meta-llama/Meta-Llama-3-8B`
(a maintainer's check in vllm-project/vllm pull request #10511, Dec 2024) and 1.19-1.24
GiB in other published vLLM 0.6-0.8 logs of Llama-3(.1)-8B at 8192 batched tokens: -4 %
to +2 %.

CUDA graphs: vLLM V0 captured decode graphs for 35 batch sizes (1, 2, 4, 8, 16, ..., 256)
and its log for Llama-3.2-1B (16 layers) reads "Graph capturing finished in 14 secs,
took 0.21 GiB" (vllm-project/vllm pull request #11349, its description). Graph memory
grows with the kernels captured, so we reserve 0.21 GiB / 16 = 13.4 MiB per layer:
0.42 GiB for a 32-layer model. Cross-checks: a vLLM 0.10.2 log of llava-v1.6-mistral-7b
(Mistral-7B's 32 layers, 67 capture sizes, twice V0's) reads "took 0.67 GiB"; a vLLM
maintainer puts graphs without LoRA at "less than 1GB" (vllm-project/vllm issue #5193).
vLLM V0 took the graphs out of the 10 % headroom after sizing the KV cache; newer
releases estimate them and keep them out of the KV budget, which is what we do.

Left out: "non_torch_memory" (CUDA context, cuBLAS and NCCL workspaces): 0.06-0.35 GiB at
TP 1 in most published logs (under 1 % of the KV cache), though 1.79 GiB in PR #10511's.
"""
from __future__ import annotations

from engines.perf.model_shape import ModelShape

#: vLLM's defaults for the profiling pass: `max_num_seqs` 256; `max_num_batched_tokens`
#: = max(max_model_len, 2048) without chunked prefill = 8192 for Llama-3-8B's context
#: (and the V1 default token budget of online serving on an A100/H100-class GPU).
PROFILE_NUM_TOKENS = 8192
PROFILE_NUM_SEQS = 256
#: float32 [S, vocab] tensors the sampler holds at once: logits, probs, logprobs
SAMPLER_FP32_COPIES = 3
#: 0.21 GiB of CUDA graphs for Llama-3.2-1B's 16 layers (vLLM PR #11349), per layer
CUDA_GRAPH_BYTES_PER_LAYER = int(0.21 * 2**30 / 16)


def activation_peak_bytes(model: ModelShape, num_tokens: int = PROFILE_NUM_TOKENS,
                          num_seqs: int = PROFILE_NUM_SEQS) -> int:
    """Peak memory above the weights of a forward pass of `num_tokens` tokens in
    `num_seqs` sequences (vLLM's profiling pass), by the formula above."""
    if num_tokens < 1 or num_seqs < 1:
        raise ValueError(f"num_tokens and num_seqs must be >= 1, got {num_tokens}, {num_seqs}")
    layer = model.bytes_per_element * num_tokens * 3 * (model.intermediate + model.hidden)
    sampler = SAMPLER_FP32_COPIES * 4 * min(num_seqs, num_tokens) * model.vocab
    return layer + sampler


def cuda_graph_bytes(model: ModelShape) -> int:
    """Memory of the captured CUDA graphs (13.4 MiB per layer, above)."""
    return CUDA_GRAPH_BYTES_PER_LAYER * model.layers


def reserve_bytes(model: ModelShape, num_tokens: int = PROFILE_NUM_TOKENS,
                  num_seqs: int = PROFILE_NUM_SEQS) -> int:
    """Everything kept out of the KV cache besides the weights."""
    return activation_peak_bytes(model, num_tokens, num_seqs) + cuda_graph_bytes(model)

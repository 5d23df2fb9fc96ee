"""A training loop that is not sftprof's, on a model family sftprof's own cases never used.

A GPT-NeoX (Pythia-410M shape: 24 layers, hidden 1024, 16 heads, vocab 50,304) from
transformers, random init, sequence 1024, micro-batch 8, bf16 weights, fused AdamW. Its NVTX
ranges are `iteration N` with `fetch`, `loss_fn` and `update` inside: none of sftprof's names.
Each CASE plants one problem (`clean` plants none), so that the saving of its fix is
1 - clean / CASE, measured without the profiler:

  clean            SDPA attention, bf16 weights, fused AdamW, pinned batches copied ahead
  eager_attention  attn_implementation="eager" (softmax and batched GEMMs over seq x seq)
  no_cache_alloc   PYTORCH_NO_CUDA_MEMORY_CACHING=1 (cudaMalloc/cudaFree for every tensor)
  fp32             float32 weights, no autocast (PyTorch's default: no TF32)
  tokenize_no_nvtx about 60 ms of pure-Python tokenising per iteration in the main thread,
                   and no NVTX ranges at all
  foreach_off      AdamW(foreach=False, fused=False): a loop of small kernels per parameter
  checkpointing    gradient checkpointing on, with memory to spare (recomputes the forward)
  checkpointing_nonreentrant  the same with use_reentrant=False (saved-tensor hooks, not a nested backward)


Cases planted blind (no rule was written for them before their captures were analysed), on either family:

  vocab_unaligned  the embedding sized to the tokenizer's length (GPT-NeoX 50,277, OPT 50,265) rather than the
                   checkpoint's multiple of 16 (50,304, 50,272): the LM head's GEMMs on unaligned rows
  anomaly_mode     torch.autograd.set_detect_anomaly(True) left on from debugging
  empty_cache      torch.cuda.empty_cache() after every iteration ("to avoid OOM")
  micro_batch_1    the same 8 sequences as 8 micro-batches of 1 with gradient accumulation
  grad_norm_log    every parameter's gradient norm read with .item() after the backward, for a dashboard
  gc_collect       gc.collect() after every iteration ("to free memory")
  fp32_lm_head     the LM head's product in float32 ("for a stable loss"): the bf16 hidden states and the tied
                   embedding upcast every iteration
  param_groups     one optimizer parameter group per parameter (layer-wise learning-rate decay), fused AdamW
  activation_log   a forward hook on every module with weights reading its output's mean magnitude with .item()
  launch_blocking  CUDA_LAUNCH_BLOCKING=1 left set from debugging (its own process: CUDA reads it when it starts)
  state_to_cpu     the model's state dict copied to the CPU after every iteration ("a checkpoint every step")
  ema_loop         an exponential moving average of the weights, updated parameter by parameter in Python
  teacher_h2d      a distillation target (8 x 1024 x 4096 float32, 128 MiB) copied to the GPU from pageable memory
                   every iteration and mixed into the loss
  offload_activations  the forward under torch.autograd.graph.save_on_cpu(pin_memory=True), left on with memory to
                   spare: every saved activation copied to the host in the forward and back in the backward
  fp32_tf32        float32 weights, no autocast, TF32 matmuls allowed (torch.set_float32_matmul_precision("high"))
  padded_mask      an attention mask with the last position of each sequence padded (a collator's padding): SDPA
                   gets an explicit mask rather than is_causal (on the H100, cuDNN's attention kernels ran 2.2x longer)
  deterministic    torch.use_deterministic_algorithms(True, warn_only=True) with CUBLAS_WORKSPACE_CONFIG=:4096:8
                   ("for reproducible runs"; its own process: cuBLAS reads the variable when it starts)

Cases planted blind on the Phi (--family phi), chosen before any rule was looked at for them (H100, 2026-12-07):

  eval_every_step  a validation loss on a held-out batch after every iteration (a no_grad forward and its .item())
  sdpa_math        SDPA's flash, memory-efficient and cuDNN backends turned off (left from a determinism hunt): SDPA
                   computes attention with its math fallback
  cpu_adamw        the optimizer offloaded (ZeRO-Offload's layout) with memory to spare: float32 master weights and
                   AdamW (PyTorch's fused CPU kernel) in host memory; gradients copied down, weights copied back
  fp64_loss        the logits cast to float64 for the cross-entropy ("for a stable loss")
  emit_nvtx        torch.autograd.profiler.emit_nvtx() left on: an NVTX range around every op
  memory_tight     GPU memory capped at 1.05 x the loop's peak allocation from iteration 2 on (a device nearly full:
                   the caching allocator frees its cache and retries when a request does not fit)

Cases planted blind on the Gemma (--family gemma), chosen before any rule was looked at for them:

  distill_teacher  distillation from a frozen teacher (the student's architecture) whose forward runs under no_grad
                   before the student's every iteration; loss = cross-entropy + KL(teacher || student) in float32
  eval_every_4     a validation loss over 4 held-out batches every 4th iteration (one in each 4-iteration window)
  autocast_fp32_weights  float32 weights under torch.autocast(bfloat16), as a Trainer's bf16 flag runs them: the
                   weights cast to bf16 every forward, gradients and AdamW in float32
  sync_timing      torch.cuda.synchronize() after the forward, the backward and the update, to log each phase's time
  pad_to_max       sequences of 256 real tokens padded to 1024 (a collator's padding="max_length"), with the attention
                   mask and ignored labels on the padding

Cases tried on rules written for the cases above, not for them:

  offload_pageable     offload_activations with save_on_cpu(pin_memory=False): the copies to and from pageable memory
  deterministic_nofill deterministic with torch.utils.deterministic.fill_uninitialized_memory = False (the same
                       algorithms, no fill of each new tensor): what the fills cost

Cases planted blind on the Falcon (--family falcon), chosen before any rule was looked at for them:

  bool_mask_loss   a completion-only loss (the first quarter of each sequence is prompt) computed by boolean indexing:
                   cross_entropy(logits[:, :-1][keep].float(), ...) rather than ignored labels
  output_attentions  output_attentions=True left on from debugging (the Falcon's SDPA path then computes attention
                   itself, to return the weights)
  adamw_foreach    torch.optim.AdamW's default implementation (foreach) rather than fused=True
  gil_thread       a thread beside the loop tokenising the next batch in pure Python (about 60 ms a batch, a thread
                   prefetcher rather than a DataLoader worker process): it holds the GIL the loop launches with

Cases planted blind on the Mixtral (--family mixtral), chosen before any rule was looked at for them:

  experts_eager    experts_implementation="eager": transformers' reference loop over the experts (each expert's
                   tokens found with torch.where), not its default grouped GEMM
  cpu_contention   the loop's threads share one core with two busy processes (a container's one-CPU quota with
                   data workers beside it, as `taskset` gives them)
  zero_grad_keep   optimizer.zero_grad(set_to_none=False): the gradients zeroed by kernels and accumulated into
                   rather than written

Cases that try the rules written for the Mixtral's cases on problems they were not written for (also --family mixtral),
with their fix loader_all_cpus below:

  experts_sorted   the experts as DeepSeek-V2's reference code loops over them: tokens sorted by expert, the counts
                   copied to the host once a layer, one slice and two GEMMs an expert
  loader_few_cpus  a DataLoader of 4 worker processes tokenising in pure Python (about 200 ms a batch), the job
                   confined to 2 cores (a CPU allotment too small for its input pipeline)

Cases planted blind on the Qwen3 (--family qwen3), chosen before any rule was looked at for them, with their fix
clip_foreach below:

  clip_foreach_off torch.nn.utils.clip_grad_norm_(foreach=False) every iteration: a norm per parameter, then a
                   multiply per parameter
  causal_mask_4d   the causal mask passed as a 4-D boolean tensor (batch x 1 x seq x seq), as packed-sequence
                   collators build them, rather than left to the attention's own causal flag
  per_sample_loss  the loss a sample at a time in a Python loop (each sample's logits cast to float32 and
                   cross-entropy), averaged, rather than the model's loss over the batch

A case that tries a rule written on per_sample_loss on a problem it was not written on (also --family qwen3):

  loss_seq_chunks  the loss over 16 chunks of 64 positions of the logits, each chunk cast to float32 (a loss chunked
                   "to save memory" after the logits are made), averaged over the tokens

Cases that try the rules written for the Gemma's cases on problems they were not written for (captured on the OPT,
tests/fixtures/foreign/opt_frozen), with their fixes teacher_deep_cached and reference_cached below:

  teacher_deep     distill_teacher with a teacher of 36 layers (the student's 24)
  reference_kl     a KL penalty to a frozen reference model (the student's architecture) whose forward runs after the
                   trained model's, as RLHF's and DPO's reference does
  eval_every_3     eval_every_4's validation pass every 3rd iteration

--family opt builds an OPT (OPT-350M's layer shape: 24 layers, hidden 1024, 16 heads, ReLU, learned positions)
instead, --family gpt2 a GPT-2 (GPT-2 medium's shape, its own tanh GELU written in Python, dropout 0.1, the
embedding padded to 50,304 as nanoGPT pads it), --family gpt_bigcode a GPTBigCode (StarCoder's architecture: one
shared key and value head, multi-query attention; vocab 49,152), --family phi a Phi (Phi-2's architecture: attention
and MLP in parallel off one layer norm, partial rotary embeddings, GELU written in Python; vocab 51,200),
--family gemma a Gemma (Gemma's architecture: GeGLU MLP 8x wide, RMSNorm, grouped-query attention with 4 key and value
heads, the embedding scaled and tied; Gemma's 256,000-token vocabulary), --family falcon a Falcon (Falcon-7B's
architecture: attention and MLP in parallel off two layer norms, fused QKV with 4 key and value heads, rotary, GELU,
no biases; Falcon's 65,024-token vocabulary), --family mixtral a Mixtral (Mixtral's architecture: 8 experts of
SwiGLU, 2 chosen a token, grouped-query attention with 4 key and value heads, RMSNorm; its 32,000-token vocabulary;
experts 2048 wide; transformers' default grouped-GEMM experts), --family qwen3 a Qwen3 (Qwen3's architecture: RMSNorm
on each head's queries and keys, grouped-query attention with 8 key and value heads, SwiGLU 3072 wide, the embedding
tied; Qwen's 151,936-token vocabulary), and --range-name names the iteration ranges (`batch N` say, a name sftprof does not know).

and FIXES are the clean loop with a fix that a finding on the clean capture proposes, so that its
saving is 1 - FIX / clean:

  compiled         the model under torch.compile (fuses the elementwise and reduction kernels that
                   the clean capture's memory-bound kernel mix names)
  gelu_tanh        GPT-2's activation as PyTorch's one-kernel tanh GELU (`gelu_pytorch_tanh`, the same function)
  compiled_layers  each transformer layer under torch.compile, the rest eager (regional compilation: no graph
                   break outside a layer can stop a layer's fusion)
  compiled_graphs  the model under torch.compile(mode="reduce-overhead"): fused and replayed as CUDA graphs, so the
                   forward and backward launch no kernel one by one (what a launch-bound finding proposes)
  loader_all_cpus  loader_few_cpus's DataLoader on all of the machine's cores (1 - loader_all_cpus / loader_few_cpus)
  clip_foreach     clip_foreach_off's clipping with foreach=True, PyTorch's default on CUDA
                   (1 - clip_foreach / clip_foreach_off)

distill_cached is distill_teacher with the teacher's logits computed once (stored with the data) rather than every
iteration (1 - distill_cached / distill_teacher), teacher_deep_cached and reference_cached are teacher_deep and
reference_kl with the frozen model's logits computed once in the same way, pad_longest is pad_to_max's batches padded
to their longest sequence (1 - pad_longest / pad_to_max), and ema_foreach is ema_loop's average updated by two foreach
calls over all parameters (its saving is 1 - ema_foreach / ema_loop), teacher_pinned teacher_h2d's target in pinned
memory, copied one iteration ahead with non_blocking as the batches are (1 - teacher_pinned / teacher_h2d), and
masked_labels is bool_mask_loss's loss from ignored labels (-100 on the prompt) in the model's own loss
(1 - masked_labels / bool_mask_loss).

Usage: foreign_loop.py CASE [CASE...] --iterations N [--window A B] [--phases] --out FILE.jsonl
Several cases run one after another in one process (no_cache_alloc, launch_blocking and the deterministic cases
need their own process: each sets a variable read when CUDA or cuBLAS starts; foreign_cases.sh runs memory_tight
alone too, so that running out of memory ends no other case). With --window, iterations A..B run
between cudaProfilerStart and cudaProfilerStop (for nsys --capture-range=cudaProfilerApi). Each
iteration's wall time (it ends with loss.item(), as most loops log) goes to --out. With --phases, the
iteration also waits for the GPU after the forward and after the backward, and records each pass's host time
(until its call returns) and wall time (until the GPU is done): where a case's extra time is spent.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import queue
import subprocess
import sys
import threading
import time
import types

import torch

CASES = (
    "clean",
    "eager_attention",
    "no_cache_alloc",
    "fp32",
    "tokenize_no_nvtx",
    "foreach_off",
    "checkpointing",
    "checkpointing_nonreentrant",
    "vocab_unaligned",
    "anomaly_mode",
    "empty_cache",
    "micro_batch_1",
    "grad_norm_log",
    "gc_collect",
    "fp32_lm_head",
    "param_groups",
    "activation_log",
    "launch_blocking",
    "state_to_cpu",
    "ema_loop",
    "ema_foreach",
    "teacher_h2d",
    "teacher_pinned",
    "offload_activations",
    "fp32_tf32",
    "padded_mask",
    "deterministic",
    "offload_pageable",
    "deterministic_nofill",
    "eval_every_step",
    "sdpa_math",
    "cpu_adamw",
    "fp64_loss",
    "emit_nvtx",
    "memory_tight",
    "distill_teacher",
    "eval_every_4",
    "teacher_deep",
    "reference_kl",
    "eval_every_3",
    "autocast_fp32_weights",
    "sync_timing",
    "pad_to_max",
    "bool_mask_loss",
    "output_attentions",
    "adamw_foreach",
    "gil_thread",
    "experts_eager",
    "cpu_contention",
    "zero_grad_keep",
    "experts_sorted",
    "loader_few_cpus",
    "clip_foreach_off",
    "causal_mask_4d",
    "per_sample_loss",
    "loss_seq_chunks",
)
FIXES = (
    "compiled",
    "gelu_tanh",
    "compiled_layers",
    "compiled_graphs",
    "distill_cached",
    "pad_longest",
    "teacher_deep_cached",
    "reference_cached",
    "masked_labels",
    "loader_all_cpus",
    "clip_foreach",
)
# The cases with a frozen model whose logits the loss compares with the trained one's (distill_loss): its layers,
# whether its forward comes before the trained model's, and whether its logits are computed once (the fix).
FROZEN = {
    "distill_teacher": (24, True, False),
    "distill_cached": (24, True, True),
    "teacher_deep": (36, True, False),
    "teacher_deep_cached": (36, True, True),
    "reference_kl": (24, False, False),
    "reference_cached": (24, False, True),
}
OWN_PROCESS = {  # read when CUDA (cuBLAS) starts: set before it does
    "no_cache_alloc": ("PYTORCH_NO_CUDA_MEMORY_CACHING", "1"),
    "launch_blocking": ("CUDA_LAUNCH_BLOCKING", "1"),
    "deterministic": ("CUBLAS_WORKSPACE_CONFIG", ":4096:8"),
    "deterministic_nofill": ("CUBLAS_WORKSPACE_CONFIG", ":4096:8"),
}
SEQ, BATCH, VOCAB = 1024, 8, 50304
VOCABS = {
    "gpt_neox": (50304, 50277),
    "opt": (50272, 50265),
    "gpt2": (50304, 50257),
    "gpt_bigcode": (49152, 49152),
    "phi": (51200, 50295),
    "gemma": (256000, 256000),
    "falcon": (65024, 65024),
    "mixtral": (32000, 32000),
    "qwen3": (151936, 151669),
}  # (the checkpoint's, the tokenizer's length)
FAMILY = "gpt_neox"
SDPA_FUSED_BACKENDS = ("flash", "mem_efficient", "cudnn")  # torch.backends.cuda.enable_{name}_sdp: sdpa_math's switches
TOKENIZE_TARGET_S = 0.06
EVAL_BATCHES = 4  # eval_every_N: a validation pass over 4 held-out batches every Nth iteration
PADDED_LENGTH = 256  # pad_to_max: each sequence's real tokens, padded to SEQ
LOSS_CHUNK = 64  # loss_seq_chunks: positions a chunk
LOADER_WORKERS, LOADER_BATCH_S, FEW_CPUS = 4, 0.2, 2  # loader_few_cpus: its workers, their work a batch, its cores


class Nvtx:
    """NVTX ranges, or nothing (the tokenize_no_nvtx case has none at all)."""

    def __init__(self, on: bool):
        self.on = on

    def push(self, name: str) -> None:
        if self.on:
            torch.cuda.nvtx.range_push(name)

    def pop(self) -> None:
        if self.on:
            torch.cuda.nvtx.range_pop()


def vocab(case: str) -> int:
    aligned, tokenizer = VOCABS[FAMILY]
    return tokenizer if case == "vocab_unaligned" else aligned


def build_model(case: str, layers: int = 24) -> torch.nn.Module:
    from transformers import (
        FalconConfig,
        FalconForCausalLM,
        GemmaConfig,
        GemmaForCausalLM,
        GPT2Config,
        GPT2LMHeadModel,
        GPTBigCodeConfig,
        GPTBigCodeForCausalLM,
        GPTNeoXConfig,
        GPTNeoXForCausalLM,
        MixtralConfig,
        MixtralForCausalLM,
        OPTConfig,
        OPTForCausalLM,
        PhiConfig,
        PhiForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    # both families' layers: 24 of hidden 1024 with 16 heads and a 4096-wide MLP
    shape = {
        "vocab_size": vocab(case),
        "hidden_size": 1024,
        "num_hidden_layers": layers,
        "num_attention_heads": 16,
        "max_position_embeddings": 2048,
        "use_cache": False,
    }
    if FAMILY == "opt":
        model_class = OPTForCausalLM
        config = OPTConfig(**shape, ffn_dim=4096, word_embed_proj_dim=1024)
    elif FAMILY == "gpt2":
        model_class = GPT2LMHeadModel
        activation = "gelu_pytorch_tanh" if case == "gelu_tanh" else "gelu_new"
        config = GPT2Config(**shape, n_inner=4096, activation_function=activation)
    elif FAMILY == "phi":
        model_class = PhiForCausalLM
        config = PhiConfig(**shape, intermediate_size=4096)
    elif FAMILY == "gemma":
        model_class = GemmaForCausalLM
        config = GemmaConfig(**shape, intermediate_size=8192, head_dim=64, num_key_value_heads=4)
    elif FAMILY == "falcon":
        model_class = FalconForCausalLM
        config = FalconConfig(
            **shape,
            ffn_hidden_size=4096,
            new_decoder_architecture=True,
            num_kv_heads=4,
            parallel_attn=True,
            bias=False,
        )
    elif FAMILY == "mixtral":
        model_class = MixtralForCausalLM
        config = MixtralConfig(
            **shape, intermediate_size=2048, num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2
        )
    elif FAMILY == "qwen3":
        model_class = Qwen3ForCausalLM
        config = Qwen3Config(
            **shape, intermediate_size=3072, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True
        )
    elif FAMILY == "gpt_bigcode":
        model_class = GPTBigCodeForCausalLM
        config = GPTBigCodeConfig(**shape, n_inner=4096, multi_query=True)
    else:
        model_class = GPTNeoXForCausalLM
        config = GPTNeoXConfig(**shape, intermediate_size=4096, rotary_pct=0.25)
    attention = "eager" if case == "eager_attention" else "sdpa"
    torch.manual_seed(0)
    dtype = torch.float32 if case in ("fp32", "fp32_tf32", "autocast_fp32_weights") else torch.bfloat16
    with torch.device("cuda"):  # initialised on the GPU: 410M parameters on the CPU take tens of seconds
        experts = {"experts_implementation": "eager"} if case == "experts_eager" else {}
        model = model_class._from_config(config, attn_implementation=attention, **experts).to(dtype)
    if FAMILY == "mixtral":
        print(f"{case}: experts {model.config._experts_implementation}", file=sys.stderr, flush=True)
    model.train()
    if case == "checkpointing":
        model.gradient_checkpointing_enable()
    if case == "checkpointing_nonreentrant":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if case == "fp32_lm_head":
        head = model.get_output_embeddings()
        head.forward = lambda hidden: torch.nn.functional.linear(hidden.float(), head.weight.float())
    if case == "activation_log":
        stats = []

        def log_output(module, inputs, output):
            if isinstance(output, torch.Tensor):
                stats.append(output.detach().float().abs().mean().item())

        for module in model.modules():
            if isinstance(getattr(module, "weight", None), torch.nn.Parameter):
                module.register_forward_hook(log_output)
    if case == "experts_sorted":
        for module in model.modules():
            if type(module).__name__ == "MixtralExperts":
                module.forward = types.MethodType(sorted_experts_forward, module)
    if case == "compiled":
        return torch.compile(model)
    if case == "compiled_graphs":
        return torch.compile(model, mode="reduce-overhead")
    if case == "compiled_layers":
        layers = max((m for m in model.modules() if isinstance(m, torch.nn.ModuleList)), key=len)
        for layer in layers:
            layer.compile()
    return model


def pin_threads(cores: set[int]) -> None:
    """Every thread of this process on `cores` (sched_setaffinity(0) would pin the calling thread only)."""
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(task), cores)


def sorted_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """experts_sorted: DeepSeek-V2's reference MoE loop (moe_infer) over MixtralExperts' weights: each token's copies
    sorted by expert, the experts' token counts copied to the host once, one slice and two GEMMs an expert."""
    tokens, top_k = top_k_index.shape
    counts = top_k_index.new_zeros(tokens, self.num_experts).scatter_(1, top_k_index, 1).sum(0)
    order = top_k_index.view(-1).argsort()
    sorted_states = hidden_states[order // top_k]
    outputs, start = [], 0
    for expert, count in enumerate(counts.cpu().tolist()):
        if count == 0:
            continue
        state = sorted_states[start : start + count]
        gate, up = torch.nn.functional.linear(state, self.gate_up_proj[expert]).chunk(2, dim=-1)
        outputs.append(torch.nn.functional.linear(self.act_fn(gate) * up, self.down_proj[expert]))
        start += count
    unsorted = torch.empty_like(sorted_states)
    unsorted[order] = torch.cat(outputs)
    weighted = unsorted.view(tokens, top_k, -1) * top_k_weights.unsqueeze(-1).to(unsorted.dtype)
    return weighted.sum(1).to(hidden_states.dtype)


class TokenisedBatches(torch.utils.data.IterableDataset):
    """loader_few_cpus' data: batch after batch of token ids, tokenised in pure Python in a worker process."""

    def __init__(self, case: str):
        self.tokenize = make_tokenizer(corpus(50000))
        self.text = calibrated_text(self.tokenize, LOADER_BATCH_S)
        self.vocab = vocab(case)

    def __iter__(self):
        while True:
            ids = batch_of(self.tokenize(self.text))
            yield torch.tensor(ids, dtype=torch.long).view(BATCH, SEQ) % self.vocab


class CpuAllotment:
    """loader_few_cpus: every thread of this process, and the processes it starts from here on, on FEW_CPUS cores (a
    job's CPU allotment). Leaving restores the threads' cores."""

    def __enter__(self):
        self.cores = os.sched_getaffinity(0)
        pin_threads(set(sorted(self.cores)[:FEW_CPUS]))
        return self

    def __exit__(self, *exc) -> None:
        pin_threads(self.cores)


class CpuContention:
    """cpu_contention: every thread of this process pinned to one core, with two busy processes beside it there, as
    a one-CPU container quota with data workers gives them. Leaving restores the threads' cores and ends the
    processes."""

    WORKERS = 2

    def __enter__(self):
        self.cores = os.sched_getaffinity(0)
        self.core = min(self.cores)
        pin_threads({self.core})
        spin = f"import os\nos.sched_setaffinity(0, {{{self.core}}})\nwhile True:\n    pass\n"
        self.workers = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(self.WORKERS)]
        return self

    def __exit__(self, *exc) -> None:
        for worker in self.workers:
            worker.kill()
            worker.wait()
        pin_threads(self.cores)


class HostAdamW:
    """AdamW on float32 master weights in host memory (ZeRO-Offload's layout, with PyTorch's fused CPU AdamW): each
    step copies the gradients to pinned host buffers, steps on the CPU and copies the weights back."""

    def __init__(self, model: torch.nn.Module):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.masters = [p.detach().float().cpu() for p in self.params]
        for master in self.masters:
            master.grad = torch.zeros_like(master)
        self.grads = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in self.params]
        self.weights = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in self.params]
        self.optimizer = torch.optim.AdamW(self.masters, lr=1e-4, fused=True)

    def step(self) -> None:
        for host, p in zip(self.grads, self.params):
            if p.grad is not None:
                host.copy_(p.grad, non_blocking=True)
        torch.cuda.current_stream().synchronize()
        for master, host in zip(self.masters, self.grads):
            master.grad.copy_(host)
        self.optimizer.step()
        for host, master, p in zip(self.weights, self.masters, self.params):
            host.copy_(master)
            p.detach().copy_(host, non_blocking=True)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None


def distill_loss(logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy plus KL(teacher || student) over the vocabulary, both in float32 from one
    log_softmax of the student's logits."""
    log_p = torch.log_softmax(logits.float(), -1)
    targets = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)
    ce = torch.nn.functional.nll_loss(log_p.flatten(0, 1), targets.flatten())
    log_q = torch.log_softmax(teacher_logits.float(), -1)
    return ce + torch.nn.functional.kl_div(log_p, log_q, log_target=True, reduction="batchmean")


def make_tokenizer(seed_text: str):
    """A pure-Python greedy longest-match tokenizer over a fixed vocabulary of substrings."""
    vocab: dict[str, int] = {}
    for width in (4, 3, 2, 1):
        for i in range(0, len(seed_text) - width, 7):
            vocab.setdefault(seed_text[i : i + width], len(vocab) % VOCAB)

    def tokenize(text: str) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            for width in (4, 3, 2, 1):
                piece = text[i : i + width]
                if piece in vocab:
                    ids.append(vocab[piece])
                    i += width
                    break
            else:
                ids.append(ord(text[i]) % VOCAB)
                i += 1
        return ids

    return tokenize


def corpus(n_chars: int) -> str:
    words = "the of and to in is was for on that with by as at from it an be this are which".split()
    out, k, size = [], 0, 0
    while size < n_chars:
        out.append(words[(k * 7919) % len(words)] + ("." if k % 13 == 0 else ""))
        size += len(out[-1]) + 1
        k += 1
    return " ".join(out)


def prefetch_tokens(tokenize, text: str, tokenized: queue.Queue) -> None:
    """gil_thread's prefetcher: one batch of token ids after another, tokenised in this process's Python."""
    while True:
        tokenized.put(batch_of(tokenize(text)))


def batch_of(ids: list[int]) -> list[int]:
    """A batch's worth of token ids (BATCH x SEQ) from the tokenised text, repeated as often as it takes."""
    return (ids * (BATCH * SEQ // max(len(ids), 1) + 1))[: BATCH * SEQ]


def calibrated_text(tokenize, target_s: float = TOKENIZE_TARGET_S) -> str:
    """Text whose tokenising takes about target_s here (fixed for the whole run): sized from a probe, then corrected
    once from the time of the text itself."""
    n_chars = 20000
    for _ in range(2):
        text = corpus(n_chars)
        started = time.perf_counter()
        tokenize(text)
        n_chars = int(n_chars * target_s / (time.perf_counter() - started))
    return corpus(n_chars)


def run_case(
    case: str, iterations: int, window: tuple[int, int] | None, out, phases: bool = False, range_name: str = "iteration"
) -> None:
    started = time.perf_counter()
    model = build_model(case)
    print(f"{case}: model built in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    if case == "adamw_foreach":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    elif case == "foreach_off":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False, fused=False)
    elif case == "cpu_adamw":
        optimizer = HostAdamW(model)
    elif case == "param_groups":
        parameters = list(model.parameters())
        groups = [{"params": [p], "lr": 1e-4 * 0.95 ** (len(parameters) - i)} for i, p in enumerate(parameters)]
        optimizer = torch.optim.AdamW(groups, lr=1e-4, fused=True)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    nvtx = Nvtx(on=case != "tokenize_no_nvtx")
    ema = [p.detach().clone() for p in model.parameters()] if case.startswith("ema_") else []
    generator = torch.Generator().manual_seed(1)
    host = [torch.randint(0, vocab(case), (BATCH, SEQ), generator=generator).pin_memory() for _ in range(4)]
    micro_batches = BATCH if case == "micro_batch_1" else 1
    torch.autograd.set_detect_anomaly(case == "anomaly_mode")
    torch.backends.cuda.matmul.allow_tf32 = case == "fp32_tf32"
    torch.use_deterministic_algorithms(case.startswith("deterministic"), warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = case != "deterministic_nofill"
    for backend in SDPA_FUSED_BACKENDS:
        getattr(torch.backends.cuda, f"enable_{backend}_sdp")(case != "sdpa_math")
    held_out = host[-1].to("cuda") if case == "eval_every_step" else None
    scoped = contextlib.ExitStack()  # what the case turns on for its iterations alone
    if case == "emit_nvtx":  # an NVTX range for every op, left on from a profiling session
        scoped.enter_context(torch.autograd.profiler.emit_nvtx())
    mask = None
    if case in ("padded_mask", "pad_to_max"):
        mask = torch.ones(BATCH, SEQ, dtype=torch.long, device="cuda")
        mask[:, PADDED_LENGTH if case == "pad_to_max" else -1 :] = 0
    teacher_model = teacher_logits = None
    frozen_layers, frozen_first, frozen_once = FROZEN.get(case, (0, True, False))
    if case in FROZEN:
        teacher_model = build_model("clean", frozen_layers).eval().requires_grad_(False)
        if frozen_once:  # the frozen model's logits computed once, as if stored beside the data
            with torch.no_grad():
                teacher_logits = teacher_model(input_ids=host[0].to("cuda")).logits
            teacher_model = None
    eval_every = int(case.rsplit("_", 1)[1]) if case.startswith("eval_every_") and case != "eval_every_step" else 0
    eval_batches = [b.to("cuda") for b in host[:EVAL_BATCHES]] if eval_every else []
    tokenize = text = None
    if case == "tokenize_no_nvtx":
        tokenize = make_tokenizer(corpus(50000))
        text = calibrated_text(tokenize)
    causal_4d = torch.ones(SEQ, SEQ, dtype=torch.bool, device="cuda").tril().expand(BATCH, 1, SEQ, SEQ)
    completion = torch.ones(BATCH, SEQ, dtype=torch.bool, device="cuda")
    completion[:, : SEQ // 4] = False  # bool_mask_loss, masked_labels: the prompt's positions carry no loss
    tokenized: queue.Queue | None = None
    if case == "gil_thread":  # the prefetcher blocks on a full queue once the loop ends
        tokenized = queue.Queue(maxsize=2)
        prefetcher_tokenize = make_tokenizer(corpus(50000))
        prefetched = (prefetcher_tokenize, calibrated_text(prefetcher_tokenize), tokenized)
        threading.Thread(target=prefetch_tokens, args=prefetched, daemon=True).start()
    if case == "cpu_contention":
        scoped.enter_context(CpuContention())
    loader = None
    if case.startswith("loader_"):
        dataset = TokenisedBatches(case)
        if case == "loader_few_cpus":
            scoped.enter_context(CpuAllotment())
        batches = torch.utils.data.DataLoader(
            dataset, batch_size=None, num_workers=LOADER_WORKERS, pin_memory=True, prefetch_factor=2
        )
        loader = iter(batches)
    next_batch = host[0].to("cuda", non_blocking=True)
    teacher = next_teacher = None
    if case.startswith("teacher_"):
        teacher = torch.randn(BATCH, SEQ, 4096, generator=generator)
        if case == "teacher_pinned":
            teacher = teacher.pin_memory()
            next_teacher = teacher.to("cuda", non_blocking=True)
    for it in range(iterations):
        if case == "memory_tight" and it == 2:  # from here on, memory capped just above the peak the loop needs
            peak = torch.cuda.max_memory_allocated()
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, 1.05 * peak / total))
        if window and it == window[0]:
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
        started = time.perf_counter()
        nvtx.push(f"{range_name} {it}")
        nvtx.push("fetch")
        batch = next_batch
        if tokenize is not None:
            ids = batch_of(tokenize(text))  # the Python work on the critical path
            batch = torch.tensor(ids, dtype=torch.long).view(BATCH, SEQ) % vocab(case)
            batch = batch.pin_memory().to("cuda", non_blocking=True)
        elif loader is not None:
            batch = next(loader).to("cuda", non_blocking=True)
        elif tokenized is not None:
            ids = tokenized.get()  # tokenised by the thread beside the loop
            next_batch = (torch.tensor(ids, dtype=torch.long).view(BATCH, SEQ) % vocab(case)).pin_memory()
            next_batch = next_batch.to("cuda", non_blocking=True)
        else:
            next_batch = host[(it + 1) % len(host)].to("cuda", non_blocking=True)
        nvtx.pop()
        nvtx.push("loss_fn")
        passes = {}
        if phases:
            torch.cuda.synchronize()
            passes = {"fetch_s": time.perf_counter() - started}
        begun = time.perf_counter()
        for part in batch.chunk(micro_batches):  # one part unless micro_batch_1: accumulated gradients
            if case == "pad_longest":  # pad_to_max's batch padded to its longest sequence: no padding left
                part = part[:, :PADDED_LENGTH].contiguous()
            if case in FROZEN:
                if teacher_model is not None and frozen_first:  # the frozen teacher's forward, before the student's
                    with torch.no_grad():
                        teacher_logits = teacher_model(input_ids=part).logits
                logits = model(input_ids=part).logits
                if teacher_model is not None and not frozen_first:  # a reference model's forward, after the policy's
                    with torch.no_grad():
                        teacher_logits = teacher_model(input_ids=part).logits
                loss = distill_loss(logits, teacher_logits, part)
            elif case == "autocast_fp32_weights":  # float32 weights, bf16 compute: the weights cast every forward
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(input_ids=part, labels=part).loss
            elif case == "bool_mask_loss":  # the prompt's positions dropped by boolean indexing before the loss
                logits = model(input_ids=part).logits
                keep = completion[:, 1:]
                loss = torch.nn.functional.cross_entropy(logits[:, :-1][keep].float(), part[:, 1:][keep])
            elif case == "masked_labels":  # the same loss from ignored labels
                loss = model(input_ids=part, labels=part.masked_fill(~completion, -100)).loss
            elif case == "output_attentions":
                loss = model(input_ids=part, labels=part, output_attentions=True).loss
            elif case.startswith("offload_"):
                with torch.autograd.graph.save_on_cpu(pin_memory=case == "offload_activations"):
                    loss = model(input_ids=part, labels=part).loss
            elif case == "fp64_loss":  # the loss in float64 "for a stable loss"
                logits = model(input_ids=part).logits
                loss = torch.nn.functional.cross_entropy(logits[:, :-1].double().flatten(0, 1), part[:, 1:].flatten())
            elif mask is not None:
                loss = model(input_ids=part, attention_mask=mask, labels=part.masked_fill(mask == 0, -100)).loss
            elif case == "causal_mask_4d":
                loss = model(input_ids=part, attention_mask=causal_4d, labels=part).loss
            elif case == "per_sample_loss":
                logits = model(input_ids=part).logits
                losses = [
                    torch.nn.functional.cross_entropy(logits[i, :-1].float(), part[i, 1:]) for i in range(len(part))
                ]
                loss = torch.stack(losses).mean()
            elif case == "loss_seq_chunks":
                logits = model(input_ids=part).logits[:, :-1]
                targets = part[:, 1:]
                losses = [
                    torch.nn.functional.cross_entropy(
                        logits[:, at : at + LOSS_CHUNK].float().flatten(0, 1),
                        targets[:, at : at + LOSS_CHUNK].flatten(),
                        reduction="sum",
                    )
                    for at in range(0, SEQ - 1, LOSS_CHUNK)
                ]
                loss = torch.stack(losses).sum() / targets.numel()
            else:
                loss = model(input_ids=part, labels=part).loss
            if teacher is not None:  # the target's copy for this iteration, mixed into the loss
                target = teacher.to("cuda") if next_teacher is None else next_teacher
                loss = loss + 1e-6 * target.mean()
            if micro_batches > 1:
                loss = loss / micro_batches
            if phases:
                passes["forward_host_s"] = time.perf_counter() - begun
                torch.cuda.synchronize()
                passes["forward_s"] = time.perf_counter() - begun
                begun = time.perf_counter()
            if case == "sync_timing":  # each phase timed for a log line, waiting for the GPU to finish it
                torch.cuda.synchronize()
                passes["forward_s"] = time.perf_counter() - begun
            loss.backward()
            if case == "sync_timing":
                torch.cuda.synchronize()
                passes["backward_s"] = time.perf_counter() - begun
        if case.startswith("clip_foreach"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=case == "clip_foreach")
        if case == "grad_norm_log":
            grad_norms = {name: p.grad.norm().item() for name, p in model.named_parameters() if p.grad is not None}
            passes["grad_norms"] = len(grad_norms)
        if phases:
            passes["backward_host_s"] = time.perf_counter() - begun
            torch.cuda.synchronize()
            passes["backward_s"] = time.perf_counter() - begun
        if next_teacher is not None:
            next_teacher = teacher.to("cuda", non_blocking=True)
        nvtx.pop()
        nvtx.push("update")
        optimizer.step()
        optimizer.zero_grad(set_to_none=case != "zero_grad_keep")
        if case == "sync_timing":
            torch.cuda.synchronize()
            passes["update_s"] = time.perf_counter() - begun
        if case == "empty_cache":
            torch.cuda.empty_cache()
        if case == "gc_collect":
            gc.collect()
        if case == "ema_loop":
            for average, p in zip(ema, model.parameters()):
                average.mul_(0.999).add_(p.detach(), alpha=0.001)
        if case == "ema_foreach":
            torch._foreach_mul_(ema, 0.999)
            torch._foreach_add_(ema, [p.detach() for p in model.parameters()], alpha=0.001)
        if held_out is not None:  # a validation loss every iteration, for the curve
            model.eval()
            with torch.no_grad():
                passes["val_loss"] = model(input_ids=held_out, labels=held_out).loss.item()
            model.train()
        if eval_batches and it % eval_every == eval_every - 1:  # a validation loss every Nth iteration
            model.eval()
            with torch.no_grad():
                losses = [model(input_ids=b, labels=b).loss for b in eval_batches]
                passes["val_loss"] = torch.stack(losses).mean().item()
            model.train()
        if case == "state_to_cpu":
            checkpoint = {name: t.to("cpu") for name, t in model.state_dict().items()}
            passes["checkpoint_tensors"] = len(checkpoint)
        nvtx.pop()
        logged = loss.item()
        nvtx.pop()
        elapsed = time.perf_counter() - started
        in_window = bool(window and window[0] <= it <= window[1])
        row = {"case": case, "iteration": it, "s": elapsed, "in_window": in_window, "loss": logged}
        out.write(json.dumps(row | passes) + "\n")
        out.flush()
        if window and it == window[1]:
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
        if it in (0, iterations - 1):
            print(f"{case}: iteration {it} {elapsed:.3f} s", file=sys.stderr, flush=True)
    scoped.close()
    torch.cuda.set_per_process_memory_fraction(1.0)
    for backend in SDPA_FUSED_BACKENDS:
        getattr(torch.backends.cuda, f"enable_{backend}_sdp")(True)
    torch.autograd.set_detect_anomaly(False)
    torch.use_deterministic_algorithms(False)
    torch.utils.deterministic.fill_uninitialized_memory = True
    torch.backends.cuda.matmul.allow_tf32 = False
    del model, optimizer, teacher_model, teacher_logits, eval_batches
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def gemm_rates(out) -> None:
    """Measured dense GEMM rates here (bf16, fp32 without TF32) for the precision gain model."""
    for dtype in (torch.bfloat16, torch.float32):
        a = torch.randn(8192, 8192, device="cuda", dtype=dtype)
        b = torch.randn(8192, 8192, device="cuda", dtype=dtype)
        for _ in range(3):
            a @ b
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - started) / 10
        out.write(json.dumps({"gemm": str(dtype), "tflops": 2 * 8192**3 / seconds / 1e12}) + "\n")


def gemm_alignment(out) -> None:
    """bf16 GEMM time with one dimension not a multiple of 8 elements (16 bytes), against the aligned size just
    above it, for an LM head's three products (logits = x w^T, dx = dlogits w, dw = dlogits^T x), at several
    sizes: the slowdown the unaligned-GEMM gain model takes from here. Each row names the kernel that ran."""
    from torch.profiler import ProfilerActivity, profile

    for tokens, hidden, aligned in ((8192, 1024, 50272), (8192, 1024, 50304), (4096, 4096, 32000), (8192, 2048, 32000)):
        for size in (aligned, aligned + 1, aligned + 2, aligned + 4):
            x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(size, hidden, device="cuda", dtype=torch.bfloat16)
            dy = torch.randn(tokens, size, device="cuda", dtype=torch.bfloat16)
            for product, a, b in (("logits", x, w.t()), ("dx", dy, w), ("dw", dy.t(), x)):
                for _ in range(3):
                    a @ b
                torch.cuda.synchronize()
                started = time.perf_counter()
                for _ in range(10):
                    a @ b
                torch.cuda.synchronize()
                seconds = (time.perf_counter() - started) / 10
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    a @ b
                    torch.cuda.synchronize()
                kernels = sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})
                row = {"gemm_alignment": product, "tokens": tokens, "hidden": hidden, "size": size}
                out.write(json.dumps(row | {"ms": 1000 * seconds, "kernels": kernels}) + "\n")
                out.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="+", choices=CASES + FIXES + ("gemm_rates", "gemm_alignment"))
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--window", type=int, nargs=2)
    parser.add_argument("--phases", action="store_true", help="wait for the GPU after each pass, timing each")
    parser.add_argument(
        "--family", choices=sorted(VOCABS), default="gpt_neox", help="the model family (default %(default)s)"
    )
    parser.add_argument("--range-name", default="iteration", help="the iteration ranges' name: NAME N")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    for case, (variable, value) in OWN_PROCESS.items():
        if case in args.cases:
            if len(args.cases) > 1:
                parser.error(f"{case} runs alone in its process: CUDA reads {variable} when it starts")
            os.environ[variable] = value
    global FAMILY  # noqa: PLW0603 -- one family for the whole process, read by vocab() and build_model()
    FAMILY = args.family
    torch.backends.cuda.matmul.allow_tf32 = False
    with open(args.out, "a") as out:
        for case in args.cases:
            if case == "gemm_rates":
                gemm_rates(out)
            elif case == "gemm_alignment":
                gemm_alignment(out)
            else:
                window = tuple(args.window) if args.window else None
                run_case(case, args.iterations, window, out, args.phases, args.range_name)


if __name__ == "__main__":
    main()

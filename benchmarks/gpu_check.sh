#!/usr/bin/env bash
# Prepared GPU check of verl's FSDP2 training path (actor_rollout_ref.actor.strategy=fsdp2) on ONE CUDA GPU.
#
#   bash benchmarks/gpu_check.sh            # from anywhere; extra arguments go to benchmarks/gpu_check.py
#
# What it checks, on a random-initialised Qwen2-0.5B-sized model (hidden 896, 24 layers, 14 heads, 2 KV heads,
# MLP 4864, tied embeddings, 494M parameters, fp32 weights) with a byte-level BPE tokenizer built offline with
# exactly Qwen2's 151,936 tokens (= embedding rows), GRPO on the arithmetic task with the `fast` rollout engine
# (8 prompts x 4 samples, 32-token responses, 2 optimizer steps per RL step), KL loss on (so the reference
# model is sharded too), bf16 mixed precision (fsdp_config.mixed_precision.param_dtype unset = bf16 on CUDA).
# One table row each, status ok / FAIL (a failing or crashing check still lets the others run):
#   1  fsdp2           3 RLTrainer steps complete with finite losses; step time, torch.cuda.max_memory_allocated,
#                      torch.cuda.memory_allocated right after each step
#   2  offload         the same with fsdp_config.param_offload + optimizer_offload (actor) and param_offload
#                      (reference): completes, and the memory held right after a step drops by >= 80% of what
#                      those flags should move off the GPU (actor shards + AdamW state + reference shards)
#   2b offload_policy  FSDP2's CPUOffloadPolicy (fsdp_config.offload_policy) for actor and reference: 2 steps
#   3  resume          a run stopped after step 2 with a checkpoint (trainer.save_freq), resumed by a second
#                      RLTrainer, logs for step 3 the metrics of check 1's uninterrupted run (timings aside)
#   4  bf16            during every forward the gathered layer weights are bf16 while the sharded parameters,
#                      their gradients and the AdamW state stay fp32; for information, how far the rollout's
#                      log-probs (used as PPO's old log-probs) are from the actor's forward on the same tokens
# Each check runs in its own worker process with a time limit; torch runs with deterministic algorithms
# (warn_only) and CUBLAS_WORKSPACE_CONFIG=:4096:8 so that check 3 can compare bit for bit.
#
# Expected runtime: about 4-5 minutes on one H200 (a model build of ~30 s, then ~20-60 s per check, most of it
# process start-up and model loading); it stops starting checks after 7.5 minutes (a check not run says so).
# Needs only what `pip install -e .` installs (with a CUDA build of torch); no network access.
#
# Output: progress, then ONE table at the end (markdown), also written as gpu_check.md and gpu_check.json
# (every figure, per-step losses and memory) with the workers' logs under $OUT, or when $OUT is unset under
# the temporary directory it names. Exit status 1 when a row FAILs.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
PYTHON=${PYTHON:-$(command -v python || command -v python3)}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export TRANSFORMERS_VERBOSITY=error

"$PYTHON" - <<'EOF'
import torch

cuda = torch.cuda.is_available()
print(f"torch {torch.__version__}, built for CUDA {torch.version.cuda}, CUDA available: {cuda}", flush=True)
if cuda:
    try:
        props = torch.cuda.get_device_properties(0)
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
        print(f"GPU 0: {props.name}, {props.total_memory / 2**30:.0f} GiB, {torch.cuda.device_count()} device(s), "
              f"cuDNN {torch.backends.cudnn.version()}, NCCL {nccl}, bf16 {torch.cuda.is_bf16_supported()}", flush=True)
    except Exception as exc:  # the check itself reports what does not work
        print(f"GPU query failed: {type(exc).__name__}: {exc}", flush=True)
EOF
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv

exec "$PYTHON" benchmarks/gpu_check.py --device cuda "$@"

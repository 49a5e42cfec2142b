"""(b) Training: tokens/s of one policy update (forward + backward + optimizer step), padded vs packed.

The update is the actor worker's own ``update_actor`` (built from the default recipe, as the trainer
builds it) on a batch shaped like a rollout: the arithmetic prompts, each followed by a response of
random tokens whose length is drawn uniformly from 1..``max_response_length`` (so padding matters), and
random advantages. The whole batch is one mini-batch (one optimizer step), split into micro-batches.

tokens/s counts real tokens only (prompt + response, the ``attention_mask`` sum, as ``perf/throughput``
does), so padded and packed rows are comparable: they do the same useful work, the padded one also
computes on the padding. "packed" is the recipe with ``MODES["packed"]``: each micro-batch packed into
one sequence (verl.workers.engine.packing), micro-batches formed by a token budget equal to the padded
micro-batch's size (``micro_batch`` rows x the batch width), so both modes put the same number of
token positions through each forward pass, the padded mode some of them padding.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from verl.bench.common import PROMPT_WIDTH_LIMIT, attn_implementation, load_prompts, recipe_config
from verl.bench.measure import Case, Prepared, median
from verl.config import derive_sizes
from verl.protocol import DataProto
from verl.workers.requests import UpdateRequest
from verl.workers.roles import ActorRolloutRefWorker
from verl.workers.rollout.base import assemble_rollout_output

MODES: dict[str, list[str]] = {
    # Distinct prompts here: nothing to share, so the padded mode is the plain padded forward.
    "padded": ["actor_rollout_ref.model.share_prompts=false"],
    "packed": ["actor_rollout_ref.model.use_remove_padding=true"],
}


def cases(
    model: str, model_path: str, sequences: int, max_response_length: int, micro_batch: int, **common: Any
) -> list[Case]:
    params = {"sequences": sequences, "max_response_length": max_response_length, "micro_batch": micro_batch}
    return [Case("train", model, model_path, {"mode": m, **params}, **common) for m in MODES]


def update_config(case: Case) -> Any:
    """The recipe, resized so that the whole batch is one mini-batch of ``micro_batch``-row micro-batches."""
    p = case.params
    sequences = p["sequences"]
    overrides = [
        f"actor_rollout_ref.model.path={case.model_path}",
        f"actor_rollout_ref.model.attn_implementation={attn_implementation()}",
        f"data.train_batch_size={sequences}",
        f"data.max_prompt_length={PROMPT_WIDTH_LIMIT}",
        f"data.max_response_length={p['max_response_length']}",
        "actor_rollout_ref.rollout.n=1",
        "algorithm.adv_estimator=reinforce_plus_plus",  # one sample per prompt; the advantages are random anyway
        f"actor_rollout_ref.actor.ppo_mini_batch_size={sequences}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={min(p['micro_batch'], sequences)}",
        f"trainer.torch_threads={case.threads}",
        "prepare.enable=false",
    ]
    return recipe_config(overrides + MODES[p["mode"]])


def rollout_like_batch(worker: ActorRolloutRefWorker, case: Case) -> DataProto:
    """Prompts + random responses of uneven length (EOS at the end of each) + random advantages."""
    max_len = case.params["max_response_length"]
    prompts = load_prompts(case.data_dir, worker.tokenizer, case.params["sequences"])
    rows = len(prompts)
    generator = torch.Generator().manual_seed(case.seed)
    vocab_size = worker.actor_model.get_input_embeddings().num_embeddings
    eos = worker.host.eos_token_ids
    lengths = torch.randint(1, max_len + 1, (rows,), generator=generator)
    responses = torch.randint(0, vocab_size, (rows, max_len), generator=generator)
    not_eos = next(i for i in range(vocab_size) if i not in eos)
    responses = torch.where(torch.isin(responses, torch.tensor(eos)), not_eos, responses)
    responses[torch.arange(rows), lengths - 1] = eos[0]
    batch = assemble_rollout_output(prompts, responses, eos, worker.tokenizer.pad_token_id, max_len)
    advantages = torch.randn(rows, 1, generator=generator) * batch.batch["response_mask"]
    batch.batch["advantages"] = advantages
    return batch


def setup(case: Case) -> Prepared:
    config = update_config(case)
    worker = ActorRolloutRefWorker(config, total_training_steps=1000, need_ref=False)
    batch = rollout_like_batch(worker, case)
    attention = batch.batch["attention_mask"]
    request = UpdateRequest(derive_sizes(config), progress=0.0)
    if case.params["mode"] == "packed":
        budget = min(case.params["micro_batch"], len(batch)) * attention.shape[1]
        request = dataclasses.replace(
            request, sizes=dataclasses.replace(request.sizes, actor_max_tokens=budget)
        )
    tokens = int(attention.sum())

    def run() -> dict[str, Any]:
        metrics = worker.update_actor(batch, request)
        return {"tokens": tokens, "grad_norm": metrics.get("actor/grad_norm")}

    info = {
        "real_tokens": tokens,
        "padded_tokens": int(attention.numel()),
        "response_tokens": int(batch.batch["response_mask"].sum()),
        "mean_response_length": float(batch.batch["response_mask"].sum(-1).float().mean()),
    }
    return Prepared(run, info=info, modules=[worker.actor_model])


def summarize(case: Case, result: dict[str, Any]) -> dict[str, Any]:
    seconds = median(result["times_s"])
    info = result["info"]
    return {
        "median_s": seconds,
        "tokens_per_s": info["real_tokens"] / seconds,
        "padding_fraction": 1 - info["real_tokens"] / info["padded_tokens"],
        **info,
    }

"""(a) Rollout: tokens/s of every registered engine, per batch size and response length.

Every engine (the rollout registry's, except the model-free ``dummy``) is built the way the actor worker
builds it, on the same model, and samples with the recipe's training settings from the same arithmetic
prompts (vllm: its own engine, started and synchronised with the model's weights during setup, so the start
is not timed; its KV cache sized to the case). Every engine samples with ``ignore_eos`` (and the EOS id
handed to it is ``vocab_size``, a token no model can emit), so every response has exactly the length asked
for and all engines do the same work, as in vLLM's benchmarks; a trained model would otherwise stop after a
few tokens and "length 128" would mean nothing.
tokens/s = response tokens (the ``response_mask`` sum) / wall seconds of one ``generate_sequences`` call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from verl.bench.common import attn_implementation, load_prompts, recipe_config
from verl.bench.measure import Case, Prepared
from verl.models import load_hf_model, load_tokenizer
from verl.workers.rollout import ROLLOUT_REGISTRY, SamplingParams, get_rollout_class

EXCLUDED_ENGINES = {"dummy"}


def engines() -> list[str]:
    """The engines to measure: whatever the registry holds now whose package is installed, ``hf`` (the
    reference) first."""
    from verl.config.verl_compat import ENGINE_PACKAGES, engine_installed

    names = sorted(
        n
        for n in ROLLOUT_REGISTRY
        if n not in EXCLUDED_ENGINES and (n not in ENGINE_PACKAGES or engine_installed(n))
    )
    return sorted(names, key=lambda n: n != "hf")


def cases(
    model: str,
    model_path: str,
    batches: list[int],
    lengths: list[int],
    engine_names: Sequence[str] | None = None,
    **common: Any,
) -> list[Case]:
    """One case per engine (``engine_names``, default every installed one), response length and batch size."""
    return [
        Case("rollout", model, model_path, {"engine": e, "batch": b, "length": n}, **common)
        for e in (engine_names or engines())
        for n in lengths
        for b in batches
    ]


def setup(case: Case) -> Prepared:
    params = case.params
    model = load_hf_model(case.model_path, attn_implementation=attn_implementation())
    tokenizer = load_tokenizer(case.model_path)
    vocab_size = model.get_input_embeddings().num_embeddings
    prompts = load_prompts(case.data_dir, tokenizer, params["batch"])
    rollout_cfg = recipe_config().actor_rollout_ref.rollout
    # ignore_eos: vLLM would otherwise also stop at the tokenizer's own EOS, which a real model emits
    sampling = SamplingParams.from_config(rollout_cfg, params["length"], ignore_eos=True)
    engine_cls = get_rollout_class(params["engine"])
    if engine_cls.owns_weights:  # vllm: built and synchronised as the actor worker does (its start is setup)
        max_len = int(prompts.batch["input_ids"].shape[1]) + params["length"]
        engine = engine_cls(
            model, [vocab_size], tokenizer.pad_token_id, config=rollout_cfg, max_model_len=max_len
        )
        engine.sync_weights(model, 0)
    else:
        engine = engine_cls(model, [vocab_size], tokenizer.pad_token_id, None)

    def run() -> dict[str, Any]:
        output = engine.generate_sequences(prompts, sampling)
        return {"tokens": int(output.batch["response_mask"].sum())}

    return Prepared(run, info={"prompt_width": int(prompts.batch["input_ids"].shape[1])}, modules=[model])


def summarize(case: Case, result: dict[str, Any]) -> dict[str, Any]:
    """The row of the table / JSON for one measured case."""
    from verl.bench.measure import median

    seconds = median(result["times_s"])
    tokens = median([r["tokens"] for r in result["runs"]])
    batch, length = case.params["batch"], case.params["length"]
    return {
        "tokens_per_run": tokens,
        "mean_response_length": tokens / batch,
        "median_s": seconds,
        "tokens_per_s": tokens / seconds,
        # One decode step of the whole batch: what batch 1 latency means.
        "ms_per_step": 1000 * seconds / length,
        **result["info"],
    }

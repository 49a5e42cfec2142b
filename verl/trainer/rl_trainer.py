"""The RL trainer: PPO-family post-training of a causal LM, one short step at a time.

One step (``train_step``), in verl's order:
  1. take a batch of prompts and repeat each ``rollout.n`` times (one group per prompt);
  2. gen: sample responses with the current policy;
  3. reward: score each response (rule functions chosen by ``data_source``);
  4. old_log_prob: log-probs of the responses under the policy that sampled them;
  5. ref: log-probs under the frozen reference (only when a KL term is on);
  6. values: the critic's per-token values (only with a critic, e.g. GAE);
  7. adv: KL penalty in the reward (optional), then the advantage estimator;
  8. update_critic, then update_actor (after ``trainer.critic_warmup`` steps).
Greedy validation on the held-out split runs every ``trainer.test_freq`` steps and at the end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl.algorithms import get_adv_estimator_fn, get_kl_controller, get_policy_loss_fn, masked_mean
from verl.config import derive_sizes
from verl.data import EpochSampler, RLDataset, collate_rl, iterate_batches
from verl.models import load_tokenizer
from verl.protocol import DataProto
from verl.trainer.advantage import apply_kl_penalty, compute_advantage
from verl.trainer.metrics import compute_data_metrics, compute_throughput_metrics, compute_validation_metrics
from verl.utils.seeding import configure_torch_threads, set_seed
from verl.utils.timing import marked_timer
from verl.utils.tracking import Tracking
from verl.workers.reward import load_reward_manager
from verl.workers.roles import ActorRolloutRefWorker, CriticWorker

logger = logging.getLogger(__name__)

PROMPT_KEYS = ["input_ids", "attention_mask", "position_ids"]


class RLTrainer:
    """Builds the datasets and workers from a config, then ``fit()`` runs the RL loop."""

    def __init__(self, config: Any, reward_fn: Any = None, val_reward_fn: Any = None) -> None:
        self.config = config
        self.sizes = derive_sizes(config)
        configure_torch_threads(config.trainer.torch_threads)
        set_seed(config.trainer.seed)
        actor_cfg = config.actor_rollout_ref.actor
        # Unknown names fail here, not at the first step after a long validation pass.
        get_adv_estimator_fn(config.algorithm.adv_estimator)
        get_policy_loss_fn(actor_cfg.policy_loss.loss_mode)
        self.need_ref = config.algorithm.use_kl_in_reward or actor_cfg.use_kl_loss
        enable_critic = config.critic.enable
        self.need_critic = config.algorithm.adv_estimator == "gae" if enable_critic is None else enable_critic
        self.recompute_old_log_prob = actor_cfg.recompute_old_log_prob
        if self.recompute_old_log_prob is None:
            on_policy = self.sizes.optimizer_steps_per_rl_step == 1
            self.recompute_old_log_prob = not on_policy or config.algorithm.use_kl_in_reward

        self._build_datasets_and_workers()
        self.reward_fn = reward_fn or load_reward_manager(
            config, self.tokenizer, config.reward_model.num_examine
        )
        self.val_reward_fn = val_reward_fn or load_reward_manager(config, self.tokenizer, 0)
        self.kl_ctrl = (
            get_kl_controller(config.algorithm.kl_ctrl) if config.algorithm.use_kl_in_reward else None
        )
        self.global_steps = 0

    def _build_datasets_and_workers(self) -> None:
        """Datasets first: the number of steps (which the LR schedule needs) follows from their size."""
        cfg = self.config
        data = cfg.data
        model_cfg = cfg.actor_rollout_ref.model
        self.tokenizer = load_tokenizer(
            model_cfg.tokenizer_path or model_cfg.path, model_cfg.trust_remote_code
        )
        dataset_kwargs = dict(
            tokenizer=self.tokenizer,
            prompt_key=data.prompt_key,
            max_prompt_length=data.max_prompt_length,
            truncation=data.truncation,
            filter_overlong_prompts=data.filter_overlong_prompts,
        )
        self.train_dataset = RLDataset(data.train_files, max_samples=data.train_max_samples, **dataset_kwargs)
        self.val_dataset = None
        if data.val_files:
            self.val_dataset = RLDataset(data.val_files, max_samples=data.val_max_samples, **dataset_kwargs)
        seed = data.seed if data.seed is not None else cfg.trainer.seed
        self.sampler = EpochSampler(
            len(self.train_dataset), data.train_batch_size, shuffle=data.shuffle, seed=seed
        )
        self.total_training_steps = (
            cfg.trainer.total_training_steps or len(self.sampler) * cfg.trainer.total_epochs
        )
        self.actor_rollout = ActorRolloutRefWorker(cfg, self.total_training_steps, self.need_ref)
        self.critic = CriticWorker(cfg, self.total_training_steps) if self.need_critic else None

    def _collate(self, items: list[dict]) -> DataProto:
        return collate_rl(items, self.tokenizer.pad_token_id)

    # ------------------------------------------------------------------ the loop

    def fit(self) -> dict[str, Any]:
        """Train for ``total_training_steps``; returns the validation metrics before and after."""
        cfg = self.config.trainer
        tracking = Tracking(
            list(cfg.logger),
            cfg.default_local_dir,
            self.total_training_steps,
            cfg.project_name,
            cfg.experiment_name,
        )
        tracking.write(self.sizes.describe())
        if not self.recompute_old_log_prob:
            tracking.write(
                "old_log_prob pass skipped: one optimizer step per RL step, so the update is on-policy"
            )
        summary: dict[str, Any] = {
            "val_before": {},
            "val_after": {},
            "metrics_path": str(tracking.metrics_path),
        }
        if cfg.val_before_train and self.val_dataset is not None:
            summary["val_before"] = self.validate()
            tracking.log(summary["val_before"], step=0)
            if cfg.val_only:
                tracking.close()
                return summary
        batches = iterate_batches(self.train_dataset, self.sampler, self._collate, num_epochs=None)
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        for step in range(1, self.total_training_steps + 1):
            self.global_steps = step
            metrics = self.train_step(next(batches), batches)
            is_last = step == self.total_training_steps
            if self.val_dataset is not None and (
                (cfg.test_freq > 0 and step % cfg.test_freq == 0) or is_last
            ):
                with marked_timer("testing", timing := {}):
                    val_metrics = self.validate()
                metrics.update(val_metrics)
                metrics["timing_s/testing"] = timing["testing"]
                summary["val_after"] = val_metrics
            if cfg.save_freq > 0 and (step % cfg.save_freq == 0 or is_last):
                with marked_timer("save_checkpoint", timing := {}):
                    self.save_hf(step)
                metrics["timing_s/save_checkpoint"] = timing["save_checkpoint"]
            tracking.log(metrics, step)
        summary["train_seconds"] = time.perf_counter() - start
        summary["last_metrics"] = metrics
        tracking.close()
        return summary

    def save_hf(self, step: int) -> Path:
        """Save the policy as a HuggingFace directory: ``<default_local_dir>/global_step_<N>/actor/huggingface``.

        Weights only: optimizer, scheduler, sampler and RNG state (for an exact resume) are not saved yet.
        """
        path = (
            Path(self.config.trainer.default_local_dir).expanduser()
            / f"global_step_{step}"
            / "actor"
            / "huggingface"
        )
        self.actor_rollout.save_hf(str(path))
        return path

    def train_step(
        self, batch: DataProto, more_prompts: Iterator[DataProto] | None = None
    ) -> dict[str, float]:
        """One RL step on a batch of prompts; returns its metrics.

        ``more_prompts`` supplies further batches when dynamic sampling (``algorithm.filter_groups``)
        drops groups and has to generate more to fill the step.
        """
        algo = self.config.algorithm
        timing: dict[str, float] = {}
        metrics: dict[str, float] = {}
        with marked_timer("step", timing):
            batch = self.rollout_and_score(batch, timing, tag="0")
            if algo.filter_groups.enable:
                batch = self.fill_with_varied_groups(batch, more_prompts, timing, metrics)

            if self.recompute_old_log_prob:
                with marked_timer("old_log_prob", timing):
                    old = self.actor_rollout.compute_log_prob(batch)
                    entropys = old.pop(batch_keys=["entropys"]).batch["entropys"]
                    metrics["actor/entropy"] = masked_mean(entropys, batch.batch["response_mask"]).item()
                    batch = batch.union(old)
            else:
                timing["old_log_prob"] = 0.0  # skipped: the update uses the detached current log-probs

            if self.need_ref:
                with marked_timer("ref", timing):
                    batch = batch.union(self.actor_rollout.compute_ref_log_prob(batch))

            if self.need_critic:
                with marked_timer("values", timing):
                    batch = batch.union(self.critic.compute_values(batch))

            with marked_timer("adv", timing):
                if algo.use_kl_in_reward:
                    metrics.update(apply_kl_penalty(batch, self.kl_ctrl, algo.kl_penalty))
                else:
                    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
                batch = compute_advantage(batch, algo)

            batch.meta_info["sizes"] = self.sizes
            batch.meta_info["progress"] = (self.global_steps - 1) / max(1, self.total_training_steps - 1)
            if self.need_critic:
                with marked_timer("update_critic", timing):
                    metrics.update(self.critic.update_critic(batch).meta_info["metrics"])

            # Critic warm-up: the first steps only fit the value function, the policy waits.
            if self.global_steps > self.config.trainer.critic_warmup:
                with marked_timer("update_actor", timing):
                    metrics.update(self.actor_rollout.update_actor(batch).meta_info["metrics"])

        metrics.update(compute_data_metrics(batch, self.config.data.max_response_length))
        metrics.update({f"timing_s/{k}": v for k, v in timing.items()})
        metrics.update(compute_throughput_metrics(batch, timing["step"], n_devices=1))
        metrics["training/global_step"] = self.global_steps
        return metrics

    def rollout_and_score(self, batch: DataProto, timing: dict[str, float], tag: str) -> DataProto:
        """Repeat each prompt ``rollout.n`` times, generate, and score: the start of every RL step."""
        algo = self.config.algorithm
        n = self.config.actor_rollout_ref.rollout.n
        # One uid per prompt: the n responses to it form one group for the advantage baseline.
        batch.non_tensor_batch["uid"] = np.array(
            [f"{self.global_steps}-{tag}-{i}" for i in range(len(batch))], dtype=object
        )
        if algo.adv_estimator == "remax":
            # ReMax's baseline: the reward of the greedy response to the same prompt.
            with marked_timer("gen_max", timing):
                _, greedy_reward = self.generate_and_score(batch, self.reward_fn, validate=True)
                baselines = greedy_reward["reward_tensor"].sum(-1).repeat_interleave(n)
        batch = batch.repeat(n, interleave=True)
        prompts = batch.pop(batch_keys=PROMPT_KEYS)
        with marked_timer("gen", timing):
            batch = batch.union(self.actor_rollout.generate_sequences(prompts))
        if algo.adv_estimator == "remax":
            batch.batch["reward_baselines"] = baselines

        with marked_timer("reward", timing):
            reward = self.reward_fn(batch, return_dict=True)
            batch.batch["token_level_scores"] = reward["reward_tensor"]
            for key, values in reward["reward_extra_info"].items():
                batch.non_tensor_batch[key] = np.array(values, dtype=object)
        return batch

    def fill_with_varied_groups(
        self, batch: DataProto, more_prompts: Iterator[DataProto] | None, timing: dict, metrics: dict
    ) -> DataProto:
        """DAPO dynamic sampling (Yu et al. 2025, arXiv 2503.14476).

        A group whose responses all score the same has zero advantage and teaches nothing: drop it,
        and generate from further prompts until ``data.train_batch_size`` groups remain (at most
        ``filter_groups.max_num_gen_batches`` generation batches; 0 = no limit).
        """
        cfg = self.config.algorithm.filter_groups
        n = self.config.actor_rollout_ref.rollout.n
        wanted = self.config.data.train_batch_size
        kept, num_groups, generated = [], 0, 0
        while True:
            generated += 1
            varied = _varied_groups(batch, cfg.metric)
            kept.append(varied)
            num_groups += len(varied) // n
            if num_groups >= wanted:
                break
            if more_prompts is None or (cfg.max_num_gen_batches > 0 and generated >= cfg.max_num_gen_batches):
                raise RuntimeError(
                    f"dynamic sampling found {num_groups} of {wanted} groups with varied rewards after {generated} "
                    "generation batches; raise algorithm.filter_groups.max_num_gen_batches, lower "
                    "data.train_batch_size, or check that the task is neither too easy nor too hard for the model"
                )
            batch = self.rollout_and_score(next(more_prompts), timing, tag=str(generated))
        metrics["train/num_gen_batches"] = generated
        # Groups are contiguous (interleaved repeat), so the first wanted * n rows are whole groups.
        return DataProto.concat(kept)[: wanted * n]

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Greedy (``rollout.val_kwargs``) generation on the whole validation set, scored by the reward."""
        val_kwargs = self.config.actor_rollout_ref.rollout.val_kwargs
        batch_size = self.config.data.val_batch_size or len(self.val_dataset)
        sources, scores = [], []
        extra: dict[str, list] = {}
        for start in range(0, len(self.val_dataset), batch_size):
            items = [
                self.val_dataset[i] for i in range(start, min(start + batch_size, len(self.val_dataset)))
            ]
            batch = self._collate(items).repeat(val_kwargs.n, interleave=True)
            batch, reward = self.generate_and_score(batch, self.val_reward_fn, validate=True)
            scores += reward["reward_tensor"].sum(-1).tolist()
            sources += list(batch.non_tensor_batch[self.config.data.reward_fn_key])
            for key, values in reward["reward_extra_info"].items():
                extra.setdefault(key, []).extend(values)
        return compute_validation_metrics(sources, scores, extra, n=val_kwargs.n)

    def generate_and_score(self, batch: DataProto, reward_fn: Any, validate: bool) -> tuple[DataProto, dict]:
        """Generate one response per row (greedy ``val_kwargs`` when ``validate``) and score it."""
        batch = batch.select(deepcopy=False)
        prompts = batch.pop(batch_keys=PROMPT_KEYS)
        prompts.meta_info["validate"] = validate
        batch = batch.union(self.actor_rollout.generate_sequences(prompts))
        return batch, reward_fn(batch, return_dict=True)


def _varied_groups(batch: DataProto, metric: str) -> DataProto:
    """The rows of ``batch`` whose group (same uid) does not have the same ``metric`` for every response."""
    if metric == "seq_reward":
        values = batch.batch["token_level_scores"].sum(-1).tolist()
    elif metric in batch.non_tensor_batch:
        values = list(batch.non_tensor_batch[metric])
    else:
        raise ValueError(
            f"algorithm.filter_groups.metric={metric!r}: choose seq_reward or a field the reward "
            f"function returns (available: {sorted(batch.non_tensor_batch)})"
        )
    by_group: dict[Any, set] = {}
    for uid, value in zip(batch.non_tensor_batch["uid"], values, strict=True):
        by_group.setdefault(uid, set()).add(value)
    keep = [i for i, uid in enumerate(batch.non_tensor_batch["uid"]) if len(by_group[uid]) > 1]
    return batch.select_idxs(keep)

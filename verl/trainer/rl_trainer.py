"""The RL trainer: PPO-family post-training of a causal LM, written on the :class:`Controller`.

One step (``_build_dag``) is a DAG of role calls, in verl's order:
  1. take a batch of prompts and repeat each ``rollout.n`` times (one group per prompt);
  2. actor_rollout.generate_sequences: sample responses with the current policy;
  3. reward.compute_score: score each response (rule functions chosen by ``data_source``);
  4. actor_rollout.compute_log_prob: log-probs under the policy that sampled them (skipped on-policy);
  5. actor_rollout.compute_ref_log_prob: log-probs under the frozen reference (when a KL term is on);
  6. critic.compute_values: per-token values (with a critic, e.g. GAE);
  7. driver: KL penalty in the reward (optional), then the advantage estimator;
  8. critic.update_critic and actor_rollout.update_actor (after ``trainer.critic_warmup`` steps).
Steps 3, 4-5 and 6 live on different roles and run at the same time; the controller starts each step
as soon as its inputs are ready. Greedy validation on the held-out split runs every
``trainer.test_freq`` steps and at the end.
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
from verl.single_controller.flow import Controller, DataChannel, Role, StepOutputs
from verl.trainer.advantage import apply_kl_penalty, compute_advantage
from verl.trainer.checkpointing import Checkpointer, drop_metrics_after
from verl.trainer.metrics import (
    compute_data_metrics,
    compute_throughput_metrics,
    compute_validation_metrics,
    rollout_probs_diff,
)
from verl.utils.seeding import configure_torch_threads, set_seed
from verl.utils.timing import marked_timer
from verl.utils.tracking import Tracking
from verl.workers.engine.batching import GLOBAL_SEQLEN, balance_across_ranks
from verl.workers.reward import REWARD_ERROR_KEY
from verl.workers.roles import ActorRolloutRefWorker, CriticWorker, RewardWorker
from verl.workers.rollout import get_rollout_class

logger = logging.getLogger(__name__)

PROMPT_KEYS = ["input_ids", "attention_mask", "position_ids"]

# The timing_s/<name> metric of each step of the DAG (verl's names).
TIMING_NAMES = {
    "compute_log_prob": "old_log_prob",
    "compute_ref_log_prob": "ref",
    "compute_values": "values",
    "compute_advantages": "adv",
    "update_critic": "update_critic",
    "update_actor": "update_actor",
}


class RLTrainer(Controller):
    """Builds the datasets and role workers from a config, then ``fit()`` runs the RL loop.

    Subclass it and override :meth:`_build_dag` to change what one step does (see ``GRPOController``).
    """

    def __init__(
        self, config: Any, reward_fn: Any = None, val_reward_fn: Any = None, compute_score: Any = None
    ) -> None:
        """``reward_fn`` / ``val_reward_fn`` replace the reward managers; ``compute_score(data_source,
        solution_str, ground_truth, extra_info)`` replaces the scoring function inside the configured
        manager. All three must pickle for ``trainer.backend=ray``."""
        trainer_cfg = config.trainer
        super().__init__(backend=trainer_cfg.backend, trace=trainer_cfg.trace)
        self.config = config
        self.sizes = derive_sizes(config)
        configure_torch_threads(trainer_cfg.torch_threads)
        set_seed(trainer_cfg.seed)
        actor_cfg = config.actor_rollout_ref.actor
        # Unknown names fail here, not at the first step after a long validation pass.
        get_adv_estimator_fn(config.algorithm.adv_estimator)
        get_policy_loss_fn(actor_cfg.policy_loss.loss_mode)
        self.need_ref = config.algorithm.use_kl_in_reward or actor_cfg.use_kl_loss
        enable_critic = config.critic.enable
        self.need_critic = config.algorithm.adv_estimator == "gae" if enable_critic is None else enable_critic
        self.balance_batch = trainer_cfg.balance_batch and self.sizes.dp_size > 1
        # The old_log_prob pass recomputes what the rollout's policy gave each token. Skipped when unset and
        # either nothing needs it (one optimizer step per RL step: the update's own detached log-probs are
        # the old ones) or the rollout engine returned them (the weights have not changed since).
        self.recompute_old_log_prob = actor_cfg.recompute_old_log_prob
        rollout_cls = get_rollout_class(config.actor_rollout_ref.rollout.name)
        self.old_log_probs_from_rollout = False
        if self.recompute_old_log_prob is None:
            on_policy = self.sizes.optimizer_steps_per_rl_step == 1
            needed = not on_policy or config.algorithm.use_kl_in_reward
            self.old_log_probs_from_rollout = needed and getattr(rollout_cls, "returns_log_probs", False)
            self.recompute_old_log_prob = needed and not self.old_log_probs_from_rollout
        self.kl_ctrl = (
            get_kl_controller(config.algorithm.kl_ctrl) if config.algorithm.use_kl_in_reward else None
        )
        self.global_steps = 0
        self._builtin_reward = (
            reward_fn is None and compute_score is None and not config.custom_reward_function.path
        )
        self._build_datasets()
        self._register_roles(
            dict(reward_fn=reward_fn, val_reward_fn=val_reward_fn, compute_score=compute_score)
        )

    def _build_datasets(self) -> None:
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
        dataset_kwargs["bad_rows"] = data.bad_rows
        if self._builtin_reward:
            # The built-in reward managers read these; a missing one is a bad row, found at load time.
            dataset_kwargs["required_fields"] = (data.reward_fn_key, "reward_model.ground_truth")
        self.train_dataset = RLDataset(
            data.train_files,
            max_samples=data.train_max_samples,
            files_key="data.train_files",
            **dataset_kwargs,
        )
        self.val_dataset = None
        if data.val_files:
            self.val_dataset = RLDataset(
                data.val_files, max_samples=data.val_max_samples, files_key="data.val_files", **dataset_kwargs
            )
        seed = data.seed if data.seed is not None else cfg.trainer.seed
        self.sampler = EpochSampler(
            len(self.train_dataset), data.train_batch_size, shuffle=data.shuffle, seed=seed
        )
        self.total_training_steps = (
            cfg.trainer.total_training_steps or len(self.sampler) * cfg.trainer.total_epochs
        )

    def _register_roles(self, reward_kwargs: dict[str, Any]) -> None:
        """The roles of PPO/GRPO; the actor and critic have ``trainer.nnodes x n_gpus_per_node`` workers."""
        cfg = self.config
        policy = dict(on_failure=cfg.trainer.on_worker_failure, max_restarts=cfg.trainer.max_worker_restarts)
        # One GPU per data-parallel rank of the trained roles (Ray places them); reward runs on CPU.
        gpus = 1 if self.backend == "ray" and self._wants_gpu() else 0
        steps = self.total_training_steps
        self.register_role(
            Role(
                "actor_rollout",
                "actor",
                worker_class=ActorRolloutRefWorker,
                init_kwargs=dict(config=cfg, total_training_steps=steps, need_ref=self.need_ref),
                num_workers=self.sizes.dp_size,
                num_gpus_per_worker=gpus,
                **policy,
            )
        )
        if self.need_critic:
            self.register_role(
                Role(
                    "critic",
                    "critic",
                    worker_class=CriticWorker,
                    init_kwargs=dict(config=cfg, total_training_steps=steps),
                    num_workers=self.sizes.dp_size,
                    num_gpus_per_worker=gpus,
                    **policy,
                )
            )
        self.register_role(
            Role(
                "reward",
                "reward_model",
                worker_class=RewardWorker,
                init_kwargs=dict(config=cfg, **reward_kwargs),
                num_workers=cfg.reward_model.num_workers,
                **policy,
            )
        )

    def _wants_gpu(self) -> bool:
        device = self.config.trainer.device
        return device == "cuda" or (device == "auto" and torch.cuda.is_available())

    def _collate(self, items: list[dict]) -> DataProto:
        return collate_rl(items, self.tokenizer.pad_token_id)

    # ------------------------------------------------------------------ one RL step

    def _build_dag(
        self, prompts: DataProto, more_prompts: Iterator[DataProto] | None = None
    ) -> dict[str, Any]:
        """Declare one RL step; returns the channels ``batch`` (what was trained on) and ``metrics`` (a list
        of channels holding metric dicts)."""
        batch, scores = self.rollout_and_score(prompts, more_prompts)
        old = ref = values = None
        if self.recompute_old_log_prob:
            old = self.step(
                role="actor_rollout",
                method="compute_log_prob",
                inputs={"data": batch},
                outputs=["old_log_probs"],
            )
        if self.need_ref:
            ref = self.step(
                role="actor_rollout",
                method="compute_ref_log_prob",
                inputs={"data": batch},
                outputs=["ref_log_prob"],
            )
        if self.need_critic:
            values = self.step(
                role="critic", method="compute_values", inputs={"data": batch}, outputs=["values"]
            )
        adv = self.step(
            method=self.compute_advantages,
            inputs={"batch": batch, "scores": scores, **_present(old=old, ref=ref, values=values)},
            outputs=["batch", "metrics"],
        )
        metrics = [adv["metrics"]]
        if self.need_critic:
            critic = self.step(
                role="critic", method="update_critic", inputs={"data": adv["batch"]}, outputs=["metrics"]
            )
            metrics.append(critic["metrics"])
        # Critic warm-up: the first steps only fit the value function, the policy waits.
        if self.global_steps > self.config.trainer.critic_warmup:
            actor = self.step(
                role="actor_rollout",
                method="update_actor",
                inputs={"data": adv["batch"]},
                outputs=["metrics"],
            )
            metrics.append(actor["metrics"])
        return {"batch": adv["batch"], "metrics": metrics}

    def rollout_and_score(
        self, prompts: DataProto, more_prompts: Iterator[DataProto] | None = None
    ) -> tuple[DataChannel | DataProto, DataChannel | DataProto]:
        """Generate ``rollout.n`` responses per prompt and score them: the batch and its scores.

        With DAPO dynamic sampling (``algorithm.filter_groups``) this reads the scores and, when too
        many groups have no reward variance, generates from ``more_prompts`` until the step is full.
        """
        prompts = self.repeat_prompts(prompts, tag="0")
        if not self.config.algorithm.filter_groups.enable:
            batch = self.balance(self.generate(prompts))
            return batch, self.score(batch)
        batch, scores = self.fill_with_varied_groups(*self.generate_and_score(prompts), more_prompts)
        if self.balance_batch:
            scores.reorder(balance_across_ranks(batch, self.sizes.dp_size))
        return batch, scores

    def balance(self, batch: DataChannel) -> DataChannel:
        """Declare the reordering of a generated batch so that every data-parallel worker of the log-prob
        and update passes gets about the same number of tokens (``trainer.balance_batch``); with one
        worker it is the batch itself."""
        if not self.balance_batch:
            return batch
        return self.step(
            method=_balance_rows,
            inputs={"batch": batch, "parts": self.sizes.dp_size},
            outputs=["batch"],
            name="balance",
        )["batch"]

    def repeat_prompts(self, batch: DataProto, tag: str) -> DataProto:
        """Give each prompt a uid (its group) and repeat it ``rollout.n`` times, consecutively."""
        n = self.config.actor_rollout_ref.rollout.n
        batch = batch.select()  # the caller's batch is left as it was
        batch.non_tensor_batch["uid"] = np.array(
            [f"{self.global_steps}-{tag}-{i}" for i in range(len(batch))], dtype=object
        )
        if self.config.algorithm.adv_estimator == "remax":
            # ReMax's baseline: the reward of the greedy response to the same prompt.
            _, greedy = self.generate_and_score(batch, validate=True, names=("gen_max", "reward_max"))
            baselines = greedy.get().batch["token_level_scores"].sum(-1).repeat_interleave(n)
            batch = batch.repeat(n, interleave=True)
            batch.batch["reward_baselines"] = baselines
            return batch
        return batch.repeat(n, interleave=True)

    def generate(self, prompts: DataProto, validate: bool = False, name: str = "gen") -> DataChannel:
        """Declare generation (greedy ``val_kwargs`` when ``validate``); the channel holds the whole batch."""
        prompts = prompts.select()  # a new DataProto: the caller's meta_info stays as it was
        prompts.meta_info["validate"] = validate
        gen = self.step(
            role="actor_rollout",
            method="generate_sequences",
            inputs={"prompts": prompts},
            outputs=["batch"],
            name=name,
        )
        return gen["batch"]

    def score(self, batch: DataChannel, name: str = "reward") -> DataChannel:
        """Declare scoring of a generated batch; the channel holds ``token_level_scores`` and extra fields."""
        return self.step(
            role="reward", method="compute_score", inputs={"data": batch}, outputs=["scores"], name=name
        )["scores"]

    def generate_and_score(
        self, prompts: DataProto, validate: bool = False, names: tuple[str, str] = ("gen", "reward")
    ) -> tuple[DataChannel, DataChannel]:
        """:meth:`generate` then :meth:`score`: the batch and its scores."""
        batch = self.generate(prompts, validate, names[0])
        return batch, self.score(batch, names[1])

    def compute_advantages(
        self,
        batch: DataProto,
        scores: DataProto,
        old: DataProto | None = None,
        ref: DataProto | None = None,
        values: DataProto | None = None,
    ) -> dict[str, Any]:
        """Driver-side: merge what the roles computed, apply the KL penalty (optional), run the estimator."""
        algo = self.config.algorithm
        metrics: dict[str, float] = {}
        batch = batch.select().union(scores)  # a new DataProto: channel values are never changed in place
        if old is not None:
            entropys = old.batch["entropys"]
            metrics["actor/entropy"] = masked_mean(entropys, batch.batch["response_mask"]).item()
            batch = batch.union(old.select(batch_keys=["old_log_probs"]))
            if "rollout_log_probs" in batch.batch:
                metrics.update(rollout_probs_diff(batch))
        elif self.old_log_probs_from_rollout:
            batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
        for part in (ref, values):
            if part is not None:
                batch = batch.union(part)
        if algo.use_kl_in_reward:
            metrics.update(apply_kl_penalty(batch, self.kl_ctrl, algo.kl_penalty))
        else:
            batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
        batch = compute_advantage(batch, algo)
        batch.meta_info["sizes"] = self.sizes
        batch.meta_info["measure_entropy"] = old is None  # no old_log_prob pass measured actor/entropy
        batch.meta_info["progress"] = (self.global_steps - 1) / max(1, self.total_training_steps - 1)
        return {"batch": batch, "metrics": metrics}

    def fill_with_varied_groups(
        self, batch: DataChannel, scores: DataChannel, more_prompts: Iterator[DataProto] | None
    ) -> tuple[DataProto, DataProto]:
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
            score_fields = list(scores.get().non_tensor_batch)
            scored = batch.get().select().union(scores.get())
            varied = _varied_groups(scored, cfg.metric)
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
            batch, scores = self.generate_and_score(
                self.repeat_prompts(next(more_prompts), tag=str(generated))
            )
        self._num_gen_batches = generated
        # Groups are contiguous (interleaved repeat), so the first wanted * n rows are whole groups.
        batch = DataProto.concat(kept)[: wanted * n]
        return batch, batch.pop(batch_keys=["token_level_scores"], non_tensor_batch_keys=score_fields)

    def train_step(
        self, prompts: DataProto, more_prompts: Iterator[DataProto] | None = None
    ) -> dict[str, float]:
        """Run one RL step (the DAG of :meth:`_build_dag`) and return its metrics."""
        self._num_gen_batches = 0
        start = time.perf_counter()
        with self.dag(f"step {self.global_steps}"):
            out = self._build_dag(prompts, more_prompts)
            metrics: dict[str, float] = {}
            for channel in out["metrics"]:
                value = channel.get()  # a dict from the driver, a DataProto carrying meta_info from a worker
                metrics.update(value.meta_info["metrics"] if isinstance(value, DataProto) else value)
            batch = out["batch"].get()
        timing = self.last_step_timings()
        timing["step"] = time.perf_counter() - start
        timing.setdefault("old_log_prob", 0.0)  # skipped on-policy: the update uses its own log-probs
        if self._num_gen_batches:
            metrics["train/num_gen_batches"] = self._num_gen_batches
        metrics.update(compute_data_metrics(batch, self.config.data.max_response_length))
        metrics.update(batch.meta_info.get(GLOBAL_SEQLEN, {}))
        metrics.update({f"timing_s/{k}": v for k, v in timing.items()})
        metrics.update(compute_throughput_metrics(batch, timing["step"], n_devices=self.sizes.dp_size))
        metrics.update({f"worker/restarts/{role}": float(n) for role, n in self.restarts.items()})
        metrics["data/skipped_rows"] = float(self.train_dataset.num_skipped_rows)
        errors = batch.non_tensor_batch.get(REWARD_ERROR_KEY)
        metrics["reward/errors"] = float(np.sum(errors)) if errors is not None else 0.0
        metrics["training/global_step"] = self.global_steps
        return metrics

    def last_step_timings(self) -> dict[str, float]:
        """Seconds each step of the last DAG ran, summed per timing name (generation may run several times)."""
        timing: dict[str, float] = {}
        for method, seconds in self.step_durations():
            name = TIMING_NAMES.get(method, method)
            timing[name] = timing.get(name, 0.0) + seconds
        return timing

    # ------------------------------------------------------------------ the loop

    def fit(self) -> dict[str, Any]:
        """Train for ``total_training_steps`` (resuming per ``trainer.resume_mode``); returns the
        validation metrics before and after."""
        cfg = self.config.trainer
        self.checkpointer = Checkpointer(self)
        start_step = self.checkpointer.resume()
        if start_step:
            drop_metrics_after(Path(cfg.default_local_dir).expanduser() / "metrics.jsonl", start_step)
        tracking = Tracking(
            list(cfg.logger),
            cfg.default_local_dir,
            self.total_training_steps,
            cfg.project_name,
            cfg.experiment_name,
        )
        tracking.write(self.sizes.describe())
        tracking.write(
            f"backend {self.backend}: "
            + ", ".join(f"{name} x{group.world_size}" for name, group in self.groups.items())
        )
        if not self.recompute_old_log_prob:
            tracking.write(
                "old_log_prob pass skipped: one optimizer step per RL step, so the update is on-policy"
            )
        summary: dict[str, Any] = {
            "val_before": {},
            "val_after": {},
            "metrics_path": str(tracking.metrics_path),
        }
        if start_step:
            tracking.write(f"resumed after step {start_step}")
        try:
            if cfg.val_before_train and self.val_dataset is not None and not start_step:
                summary["val_before"] = self.validate()
                tracking.log(summary["val_before"], step=0)
                if cfg.val_only:
                    return summary
            summary.update(self._train_loop(tracking, start_step))
            self.checkpointer.wait()
        finally:
            tracking.close()
            if self.recorder is not None:
                summary["trace_path"] = self.write_trace(
                    self.trace_path(), title=f"verl trace: {cfg.experiment_name}"
                )
        return summary

    def _train_loop(self, tracking: Tracking, start_step: int = 0) -> dict[str, Any]:
        cfg = self.config.trainer
        batches = iterate_batches(self.train_dataset, self.sampler, self._collate, num_epochs=None)
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        val_metrics: dict[str, float] = {}
        for step in range(start_step + 1, self.total_training_steps + 1):
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
            if cfg.save_freq > 0 and (step % cfg.save_freq == 0 or is_last):
                with marked_timer("save_checkpoint", timing := {}):
                    self.checkpointer.save(step)
                metrics["timing_s/save_checkpoint"] = timing["save_checkpoint"]
            if (
                cfg.on_worker_failure == "restart"
                and cfg.worker_state_freq > 0
                and step % cfg.worker_state_freq == 0
            ):
                self.save_worker_states()
            tracking.log(metrics, step)
        return {
            "val_after": val_metrics,
            "train_seconds": time.perf_counter() - start,
            "last_metrics": metrics,
        }

    def save_worker_states(self) -> None:
        """Keep a driver-side copy of the trained roles' state, which a restarted worker resumes from."""
        for role in ("actor_rollout", "critic"):
            if role in self.groups:
                self.groups[role].save_state()

    def trace_path(self) -> str:
        path = self.config.trainer.trace_path
        return str(Path(path or Path(self.config.trainer.default_local_dir) / "trace.html").expanduser())

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Greedy (``rollout.val_kwargs``) generation on the whole validation set, scored by the reward."""
        val_kwargs = self.config.actor_rollout_ref.rollout.val_kwargs
        batch_size = self.config.data.val_batch_size or len(self.val_dataset)
        sources, val_scores = [], []
        extra: dict[str, list] = {}
        with self.dag("validation"):
            outputs = []
            for start in range(0, len(self.val_dataset), batch_size):
                items = [
                    self.val_dataset[i] for i in range(start, min(start + batch_size, len(self.val_dataset)))
                ]
                batch = self._collate(items).repeat(val_kwargs.n, interleave=True)
                outputs.append(self.generate_and_score(batch, validate=True))
        for batch, scores in outputs:
            result = scores.get()
            val_scores += result.batch["token_level_scores"].sum(-1).tolist()
            sources += list(batch.get().non_tensor_batch[self.config.data.reward_fn_key])
            for key, values in result.non_tensor_batch.items():
                extra.setdefault(key, []).extend(values)
        return compute_validation_metrics(sources, val_scores, extra, n=val_kwargs.n)


class GRPOController(RLTrainer):
    """The GRPO step written out on its own: no critic, group-relative advantages, one policy update.

    An example of overriding ``_build_dag``; ``verl run --controller GRPOController`` runs it.
    """

    def _build_dag(
        self, prompts: DataProto, more_prompts: Iterator[DataProto] | None = None
    ) -> dict[str, Any]:
        if self.need_critic or self.config.algorithm.adv_estimator not in ("grpo", "grpo_passk", "rloo"):
            raise ValueError("GRPOController runs critic-free group estimators (grpo, grpo_passk, rloo)")
        batch, scores = self.generate_and_score(self.repeat_prompts(prompts, tag="0"))
        ref = (
            self.step(
                role="actor_rollout",
                method="compute_ref_log_prob",
                inputs={"data": batch},
                outputs=["ref_log_prob"],
            )
            if self.need_ref
            else None
        )
        old = (
            self.step(
                role="actor_rollout",
                method="compute_log_prob",
                inputs={"data": batch},
                outputs=["old_log_probs"],
            )
            if self.recompute_old_log_prob
            else None
        )
        adv = self.step(
            method=self.compute_advantages,
            inputs={"batch": batch, "scores": scores, **_present(old=old, ref=ref)},
            outputs=["batch", "metrics"],
        )
        actor = self.step(
            role="actor_rollout", method="update_actor", inputs={"data": adv["batch"]}, outputs=["metrics"]
        )
        return {"batch": adv["batch"], "metrics": [adv["metrics"], actor["metrics"]]}


def _present(**steps: StepOutputs | None) -> dict[str, DataChannel]:
    """The single output channel of each step that was declared (skipped steps are None)."""
    return {name: next(iter(step.values())) for name, step in steps.items() if step is not None}


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


def _balance_rows(batch: DataProto, parts: int) -> dict[str, DataProto]:
    """Driver step of :meth:`RLTrainer.balance`: a reordered copy (channel values are never changed in place)."""
    batch = batch.select()
    balance_across_ranks(batch, parts)
    return {"batch": batch}

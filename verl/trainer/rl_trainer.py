"""The RL trainer: datasets, role workers and the step plan from a config; ``fit()`` runs the loop.

The trainer owns a :class:`Controller` and calls one step function per RL step: by default
:func:`verl.trainer.step.rl_step` (verl's PPO / GRPO step), or the function named by
``trainer.step=module:fn`` / ``file.py:fn``, or the ``_build_dag`` of the Controller class named by
``trainer.controller`` (seed 000's ``class GRPOController(Controller)`` style). Greedy validation on
the held-out split runs every ``trainer.test_freq`` steps and at the last one, and never during training
with ``test_freq=-1`` (:func:`validates_after`); checkpoints every ``trainer.save_freq``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from verl.agent_loop.metrics import agent_metrics
from verl.config import ConfigError, TrainerConfig, derive_sizes, to_yaml
from verl.config.genrm import serves_genrm
from verl.config.reward_fns import parse_reward_fns
from verl.data import EpochSampler, RLDataset, collate_rl, iterate_batches
from verl.models import tokenizer_for
from verl.protocol import DataProto
from verl.single_controller.channels import resolved
from verl.single_controller.errors import WorkerError
from verl.single_controller.flow import Controller, Role
from verl.trainer.checkpointing import Checkpointer, drop_metrics_after
from verl.trainer.controllers import load_controller_class, load_step_function
from verl.trainer.generations import (
    TABLE_COLUMNS,
    decode_samples,
    dump_generations,
    generation_records,
    ground_truths,
    table_rows,
)
from verl.trainer.metrics import (
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_per_token_metrics,
    compute_validation_metrics,
    memory_metrics,
    reward_extra_metrics,
)
from verl.trainer.plan import StepPlan
from verl.trainer.pool_source import source_for
from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback, notify_saved
from verl.trainer.prepare import check_inputs
from verl.trainer.run_dir import VALIDATION_DIR, RunDirectory, RunPlan, write_run_config
from verl.trainer.seed_api import apply_seed_arguments
from verl.trainer.sources import ROLLOUT, SyncSource
from verl.trainer.step import StepFn
from verl.utils.checkpoint import rng_state, set_rng_state
from verl.utils.heap import TRIM_EVERY_STEPS, release_free_heap
from verl.utils.precision import actor_compute_line
from verl.utils.seeding import set_seed
from verl.utils.threads import configure_torch_threads, drive_on_one_openmp_thread, threads_for_run
from verl.utils.timing import marked_timer
from verl.utils.tracking import Tracking
from verl.workers.critic_worker import CriticWorker
from verl.workers.reward import REWARD_ERROR_KEY
from verl.workers.reward.combine import check_format_sources, check_no_reward_fn_in_code, needs_rule_fields
from verl.workers.reward.genrm import GenRMService
from verl.workers.reward_worker import RewardWorker
from verl.workers.roles import ActorRolloutRefWorker
from verl.workers.rollout.stats import rollout_metrics
from verl.workers.rollout_worker import RolloutWorker

logger = logging.getLogger(__name__)


def validates_after(step: int, total_steps: int, test_freq: int) -> bool:
    """Whether the held-out split is validated after RL step ``step``: every ``test_freq`` steps and after the
    last one, and never when ``test_freq <= 0`` (``-1``: no validation during training), as verl's trainer
    does. ``trainer.val_before_train`` (before step 1) is decided on its own."""
    if test_freq <= 0:
        return False
    return step % test_freq == 0 or step == total_steps


class RLTrainer:
    """Builds the datasets, the step plan and the role workers from a config; ``fit()`` trains."""

    def __init__(
        self,
        config: TrainerConfig,
        reward_fn: Callable[..., Any] | None = None,
        val_reward_fn: Callable[..., Any] | None = None,
        compute_score: Callable[..., Any] | None = None,
        *,
        actor_model: str | None = None,
        reward_model: str | Callable[..., Any] | None = None,
        use_vllm: bool = False,
        fsdp_config: dict[str, Any] | None = None,
        checkpoint_config: dict[str, Any] | None = None,
    ) -> None:
        """``reward_fn`` / ``val_reward_fn`` replace the reward managers; ``compute_score(data_source,
        solution_str, ground_truth, extra_info)`` replaces the scoring function inside the configured
        manager (all three must pickle for ``trainer.backend=ray``). ``actor_model``, ``reward_model``,
        ``use_vllm``, ``fsdp_config`` and ``checkpoint_config`` are seed 003's spelling of config keys (see
        :func:`verl.trainer.seed_api.apply_seed_arguments`)."""
        config, compute_score = apply_seed_arguments(
            config, compute_score, actor_model=actor_model, reward_model=reward_model, use_vllm=use_vllm,
            fsdp_config=fsdp_config, checkpoint_config=checkpoint_config,
        )  # fmt: skip
        self.config = config
        # The paths the user gave and every name the config gives (estimator, loss, engine, reward), before
        # anything is loaded: a typo fails here, not at the first step after a long validation pass.
        check_inputs(config)
        terms = parse_reward_fns(config.reward_model.reward_fns)
        check_no_reward_fn_in_code(terms, reward_fn or val_reward_fn)  # the terms would be silently dropped
        self.sizes = derive_sizes(config)
        self.threads = threads_for_run(config)
        configure_torch_threads(self.threads)
        drive_on_one_openmp_thread()  # this thread drives; the workers' threads compute with self.threads
        set_seed(config.trainer.seed)
        builtin_reward = (
            reward_fn is None
            and compute_score is None
            and not config.custom_reward_function.path
            and needs_rule_fields(config)
        )
        self._build_datasets(builtin_reward)
        plan = StepPlan.from_config(config, self.sizes, self.total_training_steps)
        # The one step takes its batch from the mode's source: generated now, ahead, or from a pool.
        self.plan = replace(plan, source=source_for(config, plan))
        self.controller: Controller = load_controller_class(config.trainer.controller)(
            backend=config.trainer.backend, trace=config.trainer.trace
        )
        self.step_fn: StepFn = load_step_function(config.trainer.step, self.controller)
        self.checkpoint_callback = build_checkpoint_callback(config)  # once; its on_save runs after each save
        self.global_steps = 0
        self.tracking: Tracking | None = None  # fit()'s trackers, which validation tables go to
        self.genrm: GenRMService | None = None
        """the generative reward model's server (reward_model.enable with custom_reward_function.path)"""
        try:
            self._register_roles(
                dict(reward_fn=reward_fn, val_reward_fn=val_reward_fn, compute_score=compute_score)
            )
        except BaseException:
            self._close_genrm()
            raise

    def _build_datasets(self, builtin_reward: bool) -> None:
        """Datasets first: the number of steps (which the LR schedule needs) follows from their size."""
        cfg = self.config
        data = cfg.data
        self.tokenizer = tokenizer_for(cfg.actor_rollout_ref.model)
        dataset_kwargs = dict(
            tokenizer=self.tokenizer,
            prompt_key=data.prompt_key,
            max_prompt_length=data.max_prompt_length,
            truncation=data.truncation,
            filter_overlong_prompts=data.filter_overlong_prompts,
            bad_rows=data.bad_rows,
            # extra chat-template arguments, e.g. enable_thinking=False (verl's data.apply_chat_template_kwargs)
            chat_template_kwargs=dict(data.apply_chat_template_kwargs),
        )
        tools = cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path
        if tools and "tools" not in dataset_kwargs["chat_template_kwargs"]:
            # The prompt shows the model its tools, as the chat template lays them out (verl's tool agent loop)
            from verl.tools.loader import load_tools, tool_schemas

            dataset_kwargs["chat_template_kwargs"]["tools"] = tool_schemas(load_tools(tools))
        if builtin_reward:
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
        datasets = [d for d in (self.train_dataset, self.val_dataset) if d is not None]
        check_format_sources(cfg, [row.get(data.reward_fn_key) for d in datasets for row in d.rows])
        seed = data.seed if data.seed is not None else cfg.trainer.seed
        self.sampler = EpochSampler(
            len(self.train_dataset), data.train_batch_size, shuffle=data.shuffle, seed=seed
        )
        self.total_training_steps = (
            cfg.trainer.total_training_steps or len(self.sampler) * cfg.trainer.total_epochs
        )

    def _register_roles(self, reward_kwargs: dict[str, Any]) -> None:
        """The roles of PPO / GRPO; the actor and critic have ``trainer.nnodes x n_gpus_per_node`` workers."""
        cfg = self.config
        policy = dict(
            on_failure=cfg.trainer.on_worker_failure,
            max_restarts=cfg.trainer.max_worker_restarts,
            nnodes=cfg.trainer.nnodes,  # Ray spreads each role's ranks over the nodes
            timeout_s=cfg.trainer.worker_timeout_s or None,
            heartbeat_timeout_s=cfg.trainer.heartbeat_timeout_s or None,
        )
        # One GPU per data-parallel rank of the trained roles (Ray places them); reward runs on CPU.
        wants_gpu = cfg.trainer.device == "cuda" or (
            cfg.trainer.device == "auto" and torch.cuda.is_available()
        )
        gpus = 1 if cfg.trainer.backend == "ray" and wants_gpu else 0
        # Roles whose calls compute on every core take turns in-process (Role.exclusive); one thread each can
        # run side by side. The separate rollout role has its own share of the cores and overlaps by design.
        exclusive = self.threads.threads != 1
        trained = dict(
            num_workers=self.sizes.dp_size, num_gpus_per_worker=gpus, exclusive=exclusive, **policy
        )
        steps = self.total_training_steps
        init = dict(config=cfg, total_training_steps=steps, need_ref=self.plan.ref)
        self.controller.register_role(Role("actor_rollout", "actor", ActorRolloutRefWorker, init, **trained))
        if self.plan.critic:
            init = dict(config=cfg, total_training_steps=steps)
            self.controller.register_role(Role("critic", "critic", CriticWorker, init, **trained))
        if self.plan.rollout_ahead is not None:  # the rollout on a worker of its own, one process with Ray
            self.controller.register_role(
                Role(
                    ROLLOUT, "rollout", RolloutWorker, dict(config=cfg), 1, num_gpus_per_worker=gpus, **policy
                )
            )
        init = dict(config=cfg, **reward_kwargs)
        if serves_genrm(cfg):  # served once for the run, before the reward workers that call it start
            self.genrm = GenRMService.from_config(cfg)
            init["reward_router_address"] = self.genrm.address
        workers = cfg.reward_model.num_workers
        # a discriminative reward model computes in the reward workers; rules and a served genRM do not
        computes = bool(cfg.reward_model.enable) and not serves_genrm(cfg)
        self.controller.register_role(
            Role(
                "reward",
                "reward_model",
                RewardWorker,
                init,
                workers,
                computes=computes,
                exclusive=computes and exclusive,
                **policy,
            )
        )

    def _collate(self, items: list[dict]) -> DataProto:
        return collate_rl(items, self.tokenizer.pad_token_id)

    # ------------------------------------------------------------------ one RL step

    def train_step(
        self, step: int, prompts: DataProto, more: Iterator[DataProto] | None = None
    ) -> dict[str, float]:
        """Run RL step ``step`` (the step function, inside one traced DAG) and return its metrics."""
        self.global_steps = step
        start = time.perf_counter()
        genrm_before = self.genrm.stats() if self.genrm is not None else None
        source = self.plan.source
        asked = source.batches
        with self.controller.dag(f"step {step}"):
            result = self.step_fn(self.controller, self.plan, step, prompts, more)
            if not isinstance(source, SyncSource) and source.batches == asked:
                raise ConfigError(
                    f"trainer.v1.trainer_mode={self.config.trainer.v1.trainer_mode}: the step function did not "
                    "take its batch from the mode's source; a custom step calls "
                    "verl.trainer.step.batch_source(plan).batch(flow, plan, step, prompts, more), as rl_step does"
                )
            # asynchronous modes: the weights to the rollout role, after the update just declared
            source.step_done(self.controller, self.plan, step)
            metrics: dict[str, float] = {}
            for part in result.metrics:
                metrics.update(resolved(part))
            batch = resolved(result.batch)
        timing = self.controller.last_step_timings()
        timing["step"] = time.perf_counter() - start
        timing.setdefault("old_log_prob", 0.0)  # skipped on-policy: the update uses its own log-probs
        metrics.update(compute_data_metrics(batch, self.config.data.max_response_length))
        metrics.update(agent_metrics(batch))
        metrics.update(rollout_metrics(batch))
        if self.genrm is not None and genrm_before is not None:
            metrics.update(self.genrm.stats().metrics_since(genrm_before))
        metrics.update({f"timing_s/{k}": v for k, v in timing.items()})
        metrics.update(compute_timing_per_token_metrics(batch, timing))
        metrics.update(compute_throughput_metrics(batch, timing["step"], n_devices=self.sizes.dp_size))
        metrics.update({f"worker/restarts/{role}": float(n) for role, n in self.controller.restarts.items()})
        metrics["data/skipped_rows"] = float(self.train_dataset.num_skipped_rows)
        errors = batch.non_tensor_batch.get(REWARD_ERROR_KEY)
        metrics["reward/errors"] = float(np.sum(errors)) if errors is not None else 0.0
        reward_keys = batch.meta_info.get("reward_extra_keys", ())
        metrics.update(reward_extra_metrics(batch.non_tensor_batch, reward_keys))
        metrics.update(memory_metrics())
        metrics["training/global_step"] = step
        if self.config.trainer.rollout_data_dir:
            self._dump_rollouts(batch, step)
        return metrics

    def _dump_rollouts(self, batch: DataProto, step: int) -> None:
        """``trainer.rollout_data_dir``: this step's samples as ``<step>.jsonl`` (verl's layout)."""
        inputs, responses = decode_samples(batch, self.tokenizer)
        scores = batch.batch["token_level_scores"].sum(-1).tolist()
        fields = batch.non_tensor_batch
        extra = {key: fields[key] for key in batch.meta_info.get("reward_extra_keys", ()) if key in fields}
        records = generation_records(step, inputs, responses, ground_truths(batch), scores, extra)
        dump_generations(self.config.trainer.rollout_data_dir, step, records)

    # ------------------------------------------------------------------ the loop

    def fit(self) -> dict[str, Any]:
        """Train for ``total_training_steps`` (resuming per ``trainer.resume_mode``); returns the
        validation metrics before and after. The run directory is locked for the whole run
        (:mod:`verl.trainer.run_dir`)."""
        run_dir = RunDirectory(self.config.trainer.default_local_dir)
        run = run_dir.claim(self.config)
        try:
            return self._fit(run)
        finally:
            if getattr(self, "checkpointer", None) is not None:
                self.checkpointer.settle()  # after an error: a background save lands before the lock goes
            run_dir.release()

    def _fit(self, run: RunPlan) -> dict[str, Any]:
        cfg = self.config.trainer
        self.checkpointer = Checkpointer(self.config, self.controller.groups, run.run_id)
        start_step = self._resume(run.resume_from) if run.resume_from is not None else 0
        set_aside = None
        if start_step:
            set_aside = drop_metrics_after(
                Path(cfg.default_local_dir).expanduser() / "metrics.jsonl", start_step
            )
        write_run_config(Path(cfg.default_local_dir).expanduser(), to_yaml(self.config))  # for verl report
        tracking = Tracking(
            list(cfg.logger),
            cfg.default_local_dir,
            self.total_training_steps,
            cfg.project_name,
            cfg.experiment_name,
            config=OmegaConf.to_container(self.config, resolve=True),
            initial_step=start_step,
        )
        self.tracking = tracking
        summary: dict[str, Any] = {
            "val_before": {},
            "val_after": {},
            "metrics_path": str(tracking.metrics_path),
        }
        try:
            with tracking:  # every tracker flushed and closed, also on an exception, SIGTERM or Ctrl-C
                self._describe_run(tracking, start_step, run, set_aside)
                if cfg.val_only:  # the policy as it stands (after start_step when resumed); no training
                    if self.val_dataset is None:
                        raise ConfigError("trainer.val_only=true needs data.val_files")
                    summary["val_before"] = self.validate(step=start_step)
                    tracking.log(summary["val_before"], step=start_step)
                    return summary
                if cfg.val_before_train and self.val_dataset is not None and not start_step:
                    summary["val_before"] = self.validate(step=0)
                    tracking.log(summary["val_before"], step=0)
                summary.update(self._train_loop(tracking, start_step))
                self.checkpointer.wait()
        finally:
            self.tracking = None
            if self.controller.recorder is not None:
                summary["trace_path"] = self.controller.write_trace(
                    self.trace_path(), title=f"verl trace: {cfg.experiment_name}"
                )
        return summary

    train = fit  # seed 003: trainer.train()

    def _describe_run(
        self, tracking: Tracking, start_step: int, run: RunPlan, set_aside: Path | None
    ) -> None:
        """The start-up lines: batch sizes, where the roles run, the step plan, what a resume changed."""
        tracking.write(self.sizes.describe())
        tracking.write(self.threads.describe())
        tracking.write(actor_compute_line(self.config))
        groups = ", ".join(f"{name} x{group.world_size}" for name, group in self.controller.groups.items())
        tracking.write(f"backend {self.config.trainer.backend}: {groups}")
        for name, group in self.controller.groups.items():
            if hasattr(group, "describe_placement"):  # Ray: where each rank runs
                tracking.write(f"  {name}: {group.describe_placement()}")
        tracking.write(self.plan.describe())
        role = self.plan.source.role
        tracking.write(f"rollout ({role}): {self.controller.groups[role].describe_rollout()[0]}")
        if self.genrm is not None:
            tracking.write(f"reward model (generative): {self.genrm.describe()}")
        if start_step:
            tracking.write(f"resumed after step {start_step} from {run.resume_from}")
            for change in run.config_changes:
                tracking.write(f"  changed on resume: {change}")
            if set_aside is not None:
                tracking.write(f"  metrics logged after that checkpoint moved to {set_aside}")

    def _train_loop(self, tracking: Tracking, start_step: int = 0) -> dict[str, Any]:
        cfg = self.config.trainer
        batches = iterate_batches(self.train_dataset, self.sampler, self._collate, num_epochs=None)
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        val_metrics: dict[str, float] = {}
        for step in range(start_step + 1, self.total_training_steps + 1):
            metrics = self.train_step(step, next(batches), batches)
            is_last = step == self.total_training_steps
            if self.val_dataset is not None and validates_after(
                step, self.total_training_steps, cfg.test_freq
            ):
                with marked_timer("testing", timing := {}):
                    val_metrics = self.validate(step=step)
                metrics.update(val_metrics)
                metrics["timing_s/testing"] = timing["testing"]
            if saved := cfg.save_freq > 0 and (step % cfg.save_freq == 0 or is_last):
                with marked_timer("save_checkpoint", timing := {}):
                    self.checkpointer.save(step, self.driver_state(step))
                metrics["timing_s/save_checkpoint"] = timing["save_checkpoint"]
            if (
                cfg.on_worker_failure == "restart"
                and cfg.worker_state_freq > 0
                and step % cfg.worker_state_freq == 0
            ):
                self.save_worker_states()
            tracking.log(metrics, step)
            self.checkpointer.commit()  # after the metrics: a finished checkpoint's step has its metrics line
            if saved:  # trainer.checkpoint_callback_class, in place (or being written with async_save)
                notify_saved(self.checkpoint_callback, self, step, self.checkpointer)
            if step % TRIM_EVERY_STEPS == 0:
                release_free_heap()  # the pages freed tensors leave in glibc's heap, or RSS creeps up
        return {
            "val_after": val_metrics,
            "train_seconds": time.perf_counter() - start,
            "last_metrics": metrics,
        }

    # ------------------------------------------------------------------ state

    def driver_state(self, step: int) -> dict[str, Any]:
        """What the driver adds to a checkpoint: step, sampler position, RNG, KL controller, restarts."""
        kl_ctrl = self.plan.kl_ctrl
        # The batch source's first: in the asynchronous modes it waits for the batches in flight (and keeps
        # them, and the pool), so a resume trains exactly what the uninterrupted run did. Only then the RNG: a
        # generation still running (a separate rollout role in this process) would draw from it meanwhile.
        source = self.plan.source.state_dict()
        return {
            "global_step": step,
            "sampler": self.sampler.state_dict(),
            "rng": rng_state(),
            "kl_ctrl": None if kl_ctrl is None else dict(vars(kl_ctrl)),
            "restarts": dict(self.controller.restarts),
            "batch_source": source,
        }

    def _resume(self, checkpoint: Path) -> int:
        """Restore the workers and the driver state from ``checkpoint``; the step it had finished."""
        state = self.checkpointer.resume(checkpoint)
        self.sampler.load_state_dict(state["sampler"])
        if self.plan.kl_ctrl is not None and state["kl_ctrl"] is not None:
            vars(self.plan.kl_ctrl).update(state["kl_ctrl"])
        self.controller.restarts.update(state.get("restarts", {}))
        source_state = state.get("batch_source", state.get("rollout_ahead"))  # (the key before the sources)
        if source_state:
            self.plan.source.load_state_dict(source_state)
        # Last: in-process, the workers share this process's generators, set to the same saved state.
        set_rng_state(state["rng"])
        return int(state["global_step"])

    def save_worker_states(self) -> None:
        """Keep a driver-side copy of the trained roles' state, which a restarted worker resumes from.

        A worker lost while it is copied (its node gone) keeps the previous copy: the next step's call
        meets the loss and restarts the role from that copy, as ``on_worker_failure=restart`` asks.
        """
        for role in ("actor_rollout", "critic"):
            if role in self.controller.groups:
                try:
                    self.controller.groups[role].save_state()
                except WorkerError as error:
                    logger.warning("%s; the state copy of step %d is lost, a restart resumes from the one before",
                                   error, self.global_steps)  # fmt: skip

    def trace_path(self) -> str:
        path = self.config.trainer.trace_path
        return str(Path(path or Path(self.config.trainer.default_local_dir) / "trace.html").expanduser())

    def shutdown(self, wait: bool = True) -> None:
        """Wait for running steps (unless ``wait`` is false: after Ctrl-C or SIGTERM), then stop every role's
        workers and the generative reward model's server."""
        try:
            self.controller.shutdown(wait=wait)
        finally:
            self._close_genrm()

    def _close_genrm(self) -> None:
        if getattr(self, "genrm", None) is not None:
            self.genrm.close()

    # ------------------------------------------------------------------ validation

    @torch.no_grad()
    def validate(self, step: int | None = None) -> dict[str, float]:
        """Greedy (``rollout.val_kwargs``) generation on the whole validation set, scored by the reward.
        With ``step``, the generations are also written to ``trainer.validation_data_dir`` (default: the
        run directory's ``validation/<step>.jsonl``) and ``trainer.log_val_generations`` of them go to the
        trackers as a table."""
        flow = self.controller
        val_kwargs = self.config.actor_rollout_ref.rollout.val_kwargs
        batch_size = self.config.data.val_batch_size or len(self.val_dataset)
        sources, val_scores = [], []
        extra: dict[str, list] = {}
        role = self.plan.source.validation_role(flow, step=self.global_steps if step is None else step)
        with flow.dag("validation"):
            outputs = []
            for start in range(0, len(self.val_dataset), batch_size):
                end = min(start + batch_size, len(self.val_dataset))
                prompts = self._collate([self.val_dataset[i] for i in range(start, end)])
                prompts = prompts.repeat(val_kwargs.n, interleave=True)
                batch = flow.call(role, "generate_sequences", prompts=prompts, validate=True, name="gen")
                outputs.append(
                    (batch, flow.call("reward", "compute_score", data=batch, validate=True, name="reward"))
                )
        inputs, responses, gts = [], [], []
        for batch, scores in outputs:
            result = scores.get()
            val_scores += result.batch["token_level_scores"].sum(-1).tolist()
            sources += list(batch.get().non_tensor_batch[self.config.data.reward_fn_key])
            for key, values in result.non_tensor_batch.items():
                extra.setdefault(key, []).extend(values)
            if step is not None:
                prompts_text, responses_text = decode_samples(batch.get(), self.tokenizer)
                inputs += prompts_text
                responses += responses_text
                gts += ground_truths(batch.get())
        if step is not None:
            records = generation_records(
                step, inputs, responses, gts, val_scores, {"data_source": sources, **extra}
            )
            self._log_generations(records, step)
        return compute_validation_metrics(sources, val_scores, extra, n=val_kwargs.n)

    def _log_generations(self, records: list[dict[str, Any]], step: int) -> None:
        cfg = self.config.trainer
        directory = cfg.validation_data_dir or Path(cfg.default_local_dir).expanduser() / VALIDATION_DIR
        dump_generations(directory, step, records)
        if cfg.log_val_generations > 0 and self.tracking is not None:  # None outside fit()
            rows = table_rows(records, cfg.log_val_generations)
            self.tracking.log_table("val/generations", TABLE_COLUMNS, rows, step)

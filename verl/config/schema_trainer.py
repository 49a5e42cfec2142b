"""Typed configuration schema of the ``trainer`` section (the RL loop, logging, checkpoints, workers and
failures, and verl's scheduling modes under ``trainer.v1``) and of ``async_training``, verl's fully-async keys.
Part of :mod:`verl.config.schema` (which re-exports every class here); the conventions are described there.
"""

# ruff: noqa: UP007, UP045

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class SeparateAsyncConfig:
    """``trainer.v1.separate_async``: the rollout on workers of its own, generating ahead of the trainer."""

    num_warmup_batches: Any = 1
    """batches generated ahead of the one being trained: the samples trained at step s were drawn by the
    policy of step s - num_warmup_batches (1 = one-step-off; 0 = as the synchronous trainer). A fraction as in
    verl 0.9.1: floor(num_warmup_batches x data.train_batch_size) prompts in flight beyond the step's own, each
    batch still the data order's prompts, its first floor(fraction x data.train_batch_size) drawn one step
    further back (1.5: half of each batch two versions old, half one). Streaming (async_training.
    staleness_threshold > 0), the fraction's prompts join the pool's surplus"""
    parameter_sync_step: Optional[int] = None
    """optimizer steps (mini-batches) per weight sync: data.train_batch_size / ppo_mini_batch_size here, so
    None takes it from the batch sizes; a number must equal it (verl's default 4 asks for exactly that)"""


@dataclass
class ColocateAsyncConfig:
    """``trainer.v1.colocate_async``: the actor's workers generate from a pool of generations; those unfinished
    when a batch is complete pause through the update and go on under the new weights."""

    num_warmup_batches: Any = 1
    """batches of prompts in flight beyond the step's own: each batch is the first groups of the pool to
    finish, so the slowest run on into later steps. A fraction as in verl 0.9.1: 1.5 keeps floor(1.5 x
    data.train_batch_size) prompts in flight beyond the step's own"""


@dataclass
class OffPolicySamplerConfig:
    """``trainer.v1.sampler``: how old a sample may be when it is trained."""

    max_off_policy_threshold: Optional[int] = 8
    """the most policy versions between a sample's generation and its update (checked at start: the
    pipeline's staleness is num_warmup_batches, rounded up for a fraction that adds prompts, which must stay
    below this); null = no bound (verl 0.9.1): in colocate_async and streaming separate_async no unfinished
    generation is ever restarted or waited for because of its age"""
    max_off_policy_strategy: str = "drop"
    """what colocate_async and streaming separate_async do with a generation whose first token is too old:
    drop (past the threshold, finished or not: the whole group starts again under the current weights, as verl
    evicts it; fully_async/count/restarted_groups) | wait (verl's dropless strategy: an unfinished one that has
    reached the threshold is finished with the weights the rollout holds, before the batch is taken, and
    trained, the stalest complete groups going first; fully_async/count/waited_groups; finished ones left over
    a batch after they reached it start again at the next collect). With a fixed pipeline depth (separate_async without streaming) no
    sample is ever older than the threshold, and neither acts"""


@dataclass
class TrainerV1Config:
    """``trainer.v1``: verl's scheduling modes of one trainer."""

    trainer_mode: str = "sync"
    """sync (generate, then train, on the same workers) | separate_async (a rollout role of its own generates
    the next batches while the actor trains; weights copied in after every RL step) | colocate_async
    (the actor's workers generate from a pool, unfinished generations paused at the update and continued)"""
    separate_async: SeparateAsyncConfig = field(default_factory=SeparateAsyncConfig)
    colocate_async: ColocateAsyncConfig = field(default_factory=ColocateAsyncConfig)
    sampler: OffPolicySamplerConfig = field(default_factory=OffPolicySamplerConfig)


@dataclass
class AsyncTrainingConfig:
    """``async_training``: verl's fully-async trainer's keys. Here they refine
    ``trainer.v1.trainer_mode=separate_async``: a ``staleness_threshold`` above 0 makes the rollout stream."""

    staleness_threshold: float = 0.0
    """0: every batch is a fixed set of prompts, generated num_warmup_batches steps ahead. Above 0: the
    rollout holds ceil(staleness_threshold x data.train_batch_size) prompts more, each batch is the first
    groups to finish, and the slowest go on into a later step (verl's recipe defaults to 0.1)"""
    partial_rollout: bool = True
    """a generation unfinished at a weight update goes on under the new weights (its tokens' versions
    recorded); false: it is finished under the old weights before the rollout takes the new ones"""
    trigger_parameter_sync_step: Optional[int] = None
    """optimizer steps per weight sync; as trainer.v1.separate_async.parameter_sync_step (None: derived)"""
    require_batches: int = 1
    """ppo mini-batches per optimizer step: 1 here (a mini-batch is one optimizer step)"""
    use_trainer_do_validate: bool = False
    """validation generates on the trainer's actor here in any case (true changes nothing)"""


@dataclass
class TrainerSection:
    """``trainer``: the RL loop, logging and checkpoints."""

    project_name: str = "verl"
    """project name (logging, output directory)"""
    experiment_name: str = "default"
    """experiment name (logging, output directory)"""
    total_epochs: int = 1
    """passes over the training set (ignored when total_training_steps is set)"""
    total_training_steps: Optional[int] = None
    """RL steps to run; None = total_epochs worth of steps"""
    test_freq: int = -1
    """validate every this many RL steps; -1 = never (except val_before_train)"""
    save_freq: int = -1
    """write a checkpoint every this many RL steps and at the last one; -1 = never. A checkpoint holds
    weights, optimizer, LR schedule, sampler position, every RNG, the KL controller, the step and the
    config (layout: verl.utils.checkpoint); `verl export` turns it into a HuggingFace directory"""
    resume_mode: str = "auto"
    """auto (resume from the latest checkpoint in default_local_dir, if any) | disable | a checkpoint path
    (a global_step_<N> directory). A resume that would change what the run learns (algorithm, model, data,
    batch sizes, loss, optimizer) is refused; see verl.trainer.resume_check"""
    on_existing_run: str = "refuse"
    """a run that does not resume, into a default_local_dir holding another run's checkpoints or metrics:
    refuse (stop with an error) | move_aside (move those files to <dir>.moved-<time>; nothing is deleted)"""
    max_actor_ckpt_to_keep: Optional[int] = None
    """keep at most this many checkpoints (oldest removed first); None = keep all"""
    max_critic_ckpt_to_keep: Optional[int] = None
    """the critic is saved in the same checkpoint directories as the actor, so a directory is kept while
    either cap still wants it"""
    async_save: bool = False
    """copy the state and write the checkpoint in the background, so the next step starts at once"""
    checkpoint_callback_class: Optional[str] = None
    """a CheckpointCallback subclass (verl.trainer.ppo.checkpoint_callback) by its fully qualified name, e.g.
    my_pkg.callbacks.Upload: built once with cls(config=config), its on_save(trainer, global_step, checkpoint_dir,
    async_save) runs in the driver after each checkpoint save; an exception stops training (verl 0.9.1)"""
    default_local_dir: str = "outputs/${trainer.project_name}/${trainer.experiment_name}"
    """output directory for checkpoints and logs"""
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    """metric sinks: console (a progress bar on a terminal, a line every 30 s elsewhere) | jsonl (or verl's
    name, file: metrics.jsonl) | csv (metrics.csv: a row per step, a column per metric) | tensorboard | wandb
    (offline without credentials) | mlflow (a SQLite store in the run directory unless MLFLOW_TRACKING_URI is
    set); see docs/tracking.md"""
    log_val_generations: int = 0
    """log this many validation samples (the same ones each time) as a table to the trackers that show
    tables (tensorboard text, wandb Table, mlflow artifact)"""
    validation_data_dir: Optional[str] = None
    """where each validation's generations go, as <step>.jsonl (input, output, gts, score, step); None = the
    run directory's validation/ (read by verl report)"""
    report: bool = True
    """write the run's HTML report (report.html, as `verl report`) when `verl run` ends (not in verl)"""
    rollout_data_dir: Optional[str] = None
    """where each training step's rollouts go, as <step>.jsonl in the same layout; None = not written"""
    seed: int = 1
    """global random seed"""
    val_before_train: bool = True
    """validate once before the first RL step"""
    val_only: bool = False
    """validate and exit without training"""
    nnodes: int = 1
    """number of nodes; with trainer.backend=ray each role's ranks spread over that many Ray nodes (the
    cluster named by RAY_ADDRESS, e.g. under `ray job submit`), n_gpus_per_node ranks on each"""
    n_gpus_per_node: int = 1
    """data-parallel workers per node for the actor (and critic): one per GPU, or CPU processes without GPUs"""
    backend: str = "local"
    """where role workers run: local (in this process, the default) | ray (one Ray actor process per worker;
    needed for more than one data-parallel worker)"""
    controller: str = "RLTrainer"
    """the Controller class the trainer declares its steps on: a built-in name (RLTrainer = a plain Controller,
    GRPOController) or module:Class / file.py:Class; a class that overrides _build_dag is the step"""
    step: Optional[str] = None
    """the RL step function, module:fn or file.py:fn with the signature of verl.trainer.step.rl_step
    (flow, plan, step, prompts, more) -> StepResult; None = rl_step"""
    trace: bool = False
    """write an HTML trace of every step's DAG (timings, waits, bytes moved) to trace_path"""
    trace_path: Optional[str] = None
    """where the trace goes; None = <default_local_dir>/trace.html"""
    on_worker_failure: str = "fail"
    """when a worker dies or raises: fail (stop with an error naming the role, rank and cause) | restart
    (start fresh workers, restore the actor/critic state kept on the driver, retry the step)"""
    max_worker_restarts: int = 3
    """restarts allowed per role over the whole run before giving up (on_worker_failure=restart)"""
    worker_timeout_s: Optional[float] = 1800
    """with trainer.backend=ray: the deadline of every call to a worker. A rank without a result by then (a
    stopped process, a deadlock) fails the call, named with its role, rank, node, whether it answers a
    heartbeat and its Python stack (py-spy); the workers' gloo / nccl collectives time out after as long.
    null or 0 = no deadline"""
    heartbeat_timeout_s: Optional[float] = 300
    """with trainer.backend=ray: while a call runs, each rank still out is pinged every 10 s; one whose
    process answers no ping for this long (stopped, swapped out, stuck in native code holding the GIL) fails
    the call at once, named like a rank past worker_timeout_s, without waiting for that deadline. A slow
    call still answers. null or 0 = only the deadline"""
    worker_state_freq: int = 1
    """with on_worker_failure=restart: copy the actor/critic state (weights, optimizer) to the driver every
    this many steps, so a restarted worker resumes from it; 0 = never (a restarted trained role then fails)"""
    device: str = "cpu"
    """where the actor and critic compute: cpu | cuda | auto (cuda when visible). With trainer.backend=ray
    and cuda each actor / critic worker reserves one GPU"""
    critic_warmup: int = 0
    """RL steps that train only the critic before the actor starts updating"""
    balance_batch: bool = True
    """with several data-parallel workers, reorder each step's samples so that every worker gets about
    the same number of tokens (metrics global_seqlen/*)"""
    torch_threads: Optional[Any] = "auto"
    """torch intra-op CPU threads: a number, null (torch's default: one per core), or auto (each computing
    process's share of the usable cores; one thread for a model under 2M parameters), logged at start"""
    use_v1: bool = True
    """verl's switch between its legacy and v1 trainers; there is one trainer here, and its modes are
    trainer.v1.trainer_mode"""
    v1: TrainerV1Config = field(default_factory=TrainerV1Config)
    """scheduling mode: synchronous (default) or asynchronous, with verl's keys"""

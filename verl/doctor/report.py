"""``verl doctor``'s diagnosis of one config on this machine (rendered by :mod:`verl.doctor.render`).

:func:`diagnose` loads the config exactly as ``verl run`` does (``load_config`` with the recipe
``default_recipe`` chooses), derives its sizes and step plan as the trainer does, checks its inputs with
``check_inputs``, and adds the environment, the machine, the explained batch arithmetic and the memory estimate.
Every reason the run would fail becomes one line of :attr:`Report.failures`; the exit code is 1 when there is
any.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from verl.doctor.batches import BatchReport, explain_batches, validation_rows
from verl.doctor.environment import (
    UNTESTED,
    InstalledMetadata,
    Machine,
    Metadata,
    PackageRow,
    disk_free,
    find_clashes,
    package_rows,
    read_machine,
)
from verl.doctor.memory import estimate_memory
from verl.doctor.memory_advice import PHASE_NAMES, checkpoint_bytes, phase_knobs, state_knobs
from verl.doctor.memory_terms import ACCURACY, Estimate
from verl.doctor.model_shape import (
    Models,
    ModelShape,
    count_model,
    dtype_bytes,
    fmt_count,
    lora_parameters,
    lora_settings,
)
from verl.doctor.models import ModelSource, checkpoint_dtype_bytes, model_at, policy_model
from verl.doctor.packages import environment_failures, needed_packages
from verl.utils.units import fmt_bytes


@dataclass(frozen=True)
class Verdict:
    """Peak memory on one device against what it has."""

    device: str
    """gpu (per GPU) or cpu (the node's memory)"""
    need: int
    phase: str
    have: int | None
    """None: no such device here"""

    @property
    def fits(self) -> bool:
        return self.have is not None and self.need <= self.have

    @property
    def tight(self) -> bool:
        """Fits, but within the estimate's error margin."""
        return self.fits and self.have is not None and self.need * (1 + ACCURACY) > self.have


@dataclass
class Report:
    """Everything ``verl doctor`` found, for one config."""

    recipe: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    packages: list[PackageRow] = field(default_factory=list)
    machine: Machine | None = None
    device: str = "cpu"
    """where training computes: cpu or cuda (trainer.device, auto resolved here)"""
    device_setting: str = "cpu"
    """trainer.device as set"""
    disks: list[tuple[str, str, int]] = field(default_factory=list)
    """(what, where, free bytes)"""
    batches: BatchReport | None = None
    models: list[str] = field(default_factory=list)
    """one line per model counted"""
    estimate: Estimate | None = None
    estimate_unavailable: str = ""
    checkpoint: int | None = None
    """bytes of one checkpoint"""
    planned: bool = False
    """the GPUs are assumed (``--gpu-memory``): the CPU memory of this machine is not the one to compare with"""
    verdicts: list[Verdict] = field(default_factory=list)
    knobs: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.failures else 0


# --------------------------------------------------------------------------------------------------------------
# diagnosis
# --------------------------------------------------------------------------------------------------------------


def load_run_config(source: str | None, overrides: list[str]) -> tuple[Any, list[str]]:
    """The config ``verl run`` would train with, and its recipe lines (raises ConfigError as ``verl run`` does)."""
    from verl.command_line import recipe_lines
    from verl.config import TrainerConfig, load_config
    from verl.config.recipe_files import default_recipe

    config = load_config(source or default_recipe(TrainerConfig, overrides)[0], overrides)
    return config, recipe_lines(source, overrides, config)


def _training_device(config: Any, machine: Machine) -> str:
    asked = config.trainer.device
    if asked == "auto":
        return "cuda" if machine.gpus else "cpu"
    return str(asked)


def _count(source: ModelSource, kind: str) -> tuple[ModelShape | None, str]:
    if source.hf_config is None:
        return None, source.source
    try:
        return count_model(source.hf_config, source.source, kind), ""
    except Exception as error:  # an architecture transformers cannot build from its config
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return None, f"{source.source}: cannot build the model on the meta device ({first[:160]})"


def _describe_shape(role: str, shape: ModelShape, extra: str = "") -> str:
    arch = type(shape.hf_config).__name__.removesuffix("Config") if shape.hf_config is not None else "model"
    return (
        f"{role}: {fmt_count(shape.params)} parameters ({arch}: {shape.layers} layers, hidden {shape.hidden}, "
        f"intermediate {shape.intermediate}, {shape.heads} heads / {shape.kv_heads} kv heads of {shape.head_dim}, "
        f"vocab {shape.vocab}){extra}; from {shape.source}"
    )


def diagnose(
    source: str | None,
    overrides: list[str],
    meta: Metadata | None = None,
    machine: Machine | None = None,
    gpu_memory: float | None = None,
) -> Report:
    """The whole diagnosis of ``verl run [--config source] overrides`` on this machine (``meta`` and
    ``machine`` replace what is read from it). ``gpu_memory`` (GiB): plan for a machine with as many GPUs of
    that size as the config asks, instead of this one's (its CPU memory is then not compared). Raises
    ConfigError for a config ``verl run`` would refuse."""
    from verl.config.loader import with_updates
    from verl.config.sizes import derive_sizes
    from verl.config.verl_compat import notices
    from verl.errors import InputError, PackageError, UserError
    from verl.trainer.plan import StepPlan
    from verl.trainer.prepare import check_inputs, plan_inputs
    from verl.workers.rollout import get_rollout_class

    report = Report()
    config, report.recipe = load_run_config(source, overrides)
    report.notices = notices(config)
    sizes = derive_sizes(config)
    plan = StepPlan.from_config(config, sizes, int(config.trainer.total_training_steps or 1))

    meta = meta or InstalledMetadata()
    report.packages = package_rows(meta, clashes=find_clashes(meta))
    report.machine = machine = machine or read_machine()
    if gpu_memory is not None:
        report.machine = machine = assumed_gpus(machine, config, gpu_memory)
        report.planned = True
    report.device = _training_device(config, machine)
    report.device_setting = str(config.trainer.device)

    try:
        check_inputs(config)
    except InputError as error:
        report.failures.append(f"input: {error}")
    except PackageError:  # its last check: the environment section below reports each package
        pass
    try:
        prepare_plan = plan_inputs(config)
        resolved = with_updates(config, prepare_plan.updates())
    except UserError as error:
        if getattr(error, "exit_code", 1) == 2:
            raise
        report.failures.append(f"input: {error}")
        prepare_plan, resolved = None, config

    _check_run_directory(report, resolved)

    gguf = bool(prepare_plan and prepare_plan.gguf_models)
    report.failures += environment_failures(report.packages, needed_packages(config, gguf))
    owns_weights = get_rollout_class(config.actor_rollout_ref.rollout.name).owns_weights
    report.batches = explain_batches(
        config,
        sizes,
        plan.old_log_probs,
        plan.ref,
        plan.critic,
        owns_weights,
        validation_rows(resolved, sizes.dp_size),
    )
    _check_device(report, config, machine)
    _estimate(report, config, resolved, prepare_plan, plan, sizes.strategy, owns_weights)
    _check_disks(report, config, resolved, prepare_plan)
    _check_sandbox(report, config)
    _machine_warnings(report, config, machine)
    return report


def _check_sandbox(report: Report, config: Any) -> None:
    """A python tool in the tool config needs the OS sandbox (verl.tools.isolation): a host that cannot
    isolate fails here as the run would at start-up, with the reason and the fix."""
    path = OmegaConf.select(config, "actor_rollout_ref.rollout.multi_turn.tool_config_path")
    if not path:
        return
    import yaml

    from verl.tools.config import tool_config_file

    try:
        entries = yaml.safe_load(tool_config_file(path).read_text()).get("tools") or []
    except Exception:  # an unreadable tool config is the run's to report, with its own message
        return
    isolated = [
        e
        for e in entries
        if isinstance(e, dict)
        and str(e.get("class_name", "")).replace(":", ".").endswith("python_sandbox.PythonTool")
        and (e.get("config") or {}).get("isolation", "bwrap") != "none"
    ]
    if not isolated:
        return
    from verl.tools import isolation

    try:
        isolation.require()
    except isolation.IsolationUnavailable as error:
        report.failures.append(f"python tool: no OS sandbox on this host: {error}")


def _check_run_directory(report: Report, config: Any) -> None:
    """What ``verl run`` checks before it builds anything: a locked or unusable run directory fails.

    An earlier run in the directory is a warning, not a failure: doctor asks whether the config can run, and
    right after a first ``verl run`` its directory always holds that run (the README runs ``verl doctor``
    then). It names the directory and the ways out; whatever else the check refuses still fails."""
    from verl.config.loader import with_updates
    from verl.errors import UserError
    from verl.trainer.run_dir import check_run_directory, earlier_run_files
    from verl.utils.checkpoint import latest_checkpoint_or_none

    try:
        check_run_directory(config)
        return
    except UserError as error:
        refused = error
    try:  # the same check with the earlier run moved aside: anything it still refuses is a real problem
        check_run_directory(with_updates(config, {"trainer.on_existing_run": "move_aside"}))
    except UserError as error:
        report.failures.append(f"run directory: {error}")
        if str(error) == str(refused):
            return  # refused for that reason alone, whatever the directory holds
    root = str(config.trainer.default_local_dir)
    found = ", ".join(p.name for p in earlier_run_files(Path(root).expanduser()))
    resume = ""
    if config.trainer.resume_mode != "auto" and latest_checkpoint_or_none(Path(root).expanduser()):
        resume = "; to continue it instead, set trainer.resume_mode=auto"
    report.warnings.append(
        f"run directory: {root} already holds a run ({found}); `verl run` with this config is refused there "
        f"(exit {getattr(refused, 'exit_code', 1)}): give it a new directory with trainer.experiment_name=<new "
        "name> (or trainer.default_local_dir), or set trainer.on_existing_run=move_aside to move the old "
        f"run's files to a sibling directory (nothing is deleted){resume}"
    )


def assumed_gpus(machine: Machine, config: Any, gib: float) -> Machine:
    """``machine`` with as many GPUs of ``gib`` GiB (all free) as ``config`` asks for (``--gpu-memory``)."""
    from dataclasses import replace

    from verl.doctor.environment import GpuInfo

    count = int(config.trainer.n_gpus_per_node) if config.trainer.backend == "ray" else 1
    size = int(gib * (1 << 30))
    return replace(
        machine, gpus=[GpuInfo(i, f"assumed (--gpu-memory {gib:g})", size, size) for i in range(count)]
    )


def _check_device(report: Report, config: Any, machine: Machine) -> None:
    if report.device != "cuda":
        return
    needed = int(config.trainer.n_gpus_per_node) if config.trainer.backend == "ray" else 1
    if not machine.gpus:
        report.failures.append(
            f"device: trainer.device={config.trainer.device} but this process sees no CUDA device (torch.cuda); "
            "use trainer.device=cpu or auto"
        )
    elif len(machine.gpus) < needed:
        report.failures.append(
            f"device: trainer.backend=ray with trainer.n_gpus_per_node={needed} needs {needed} GPUs, "
            f"{len(machine.gpus)} visible"
        )


def _estimate(
    report: Report,
    config: Any,
    resolved: Any,
    prepare_plan: Any,
    plan: Any,
    strategy: str,
    owns_weights: bool,
) -> None:
    """The models counted, the estimate, and its verdict per device."""
    if prepare_plan is None:
        report.estimate_unavailable = "the model could not be located (see the input line below)"
        return
    actor, why = _count(policy_model(config, prepare_plan), "causal")
    if actor is None:
        report.estimate_unavailable = why
        return
    arr = config.actor_rollout_ref
    lora = lora_settings(arr.model)
    extra = ""
    if lora:
        extra = f", LoRA rank {lora[0]}: {fmt_count(lora_parameters(actor, *lora))} adapter parameters"
    report.models.append(_describe_shape("policy", actor, extra))
    models = Models(actor)
    if plan.critic:
        critic_path = resolved.critic.model.path or resolved.actor_rollout_ref.model.path
        same = not config.critic.model.path
        source = (
            policy_model(config, prepare_plan)
            if same
            else model_at(critic_path, config.critic.model, "critic.model.path")
        )
        if source.hf_config is not None:
            source = ModelSource(_value_config(source.hf_config), source.source)
        critic, why = _count(source, "value")
        if critic is None:
            report.estimate_unavailable = f"critic: {why}"
            return
        report.models.append(_describe_shape("critic", critic))
        models = Models(actor, critic)
    if config.reward_model.enable:
        source = model_at(
            config.reward_model.model.path, config.reward_model.model, "reward_model.model.path"
        )
        reward, why = _count(source, "reward")
        if reward is None:
            report.estimate_unavailable = f"reward model: {why}"
            return
        report.models.append(_describe_shape("reward model", reward))
        models = Models(models.actor, models.critic, reward, checkpoint_dtype_bytes(reward.hf_config))
    machine = report.machine
    on_gpu = report.device == "cuda"
    gpu_total = min((g.total for g in machine.gpus), default=None) if machine else None
    estimate = estimate_memory(
        config,
        report.batches,
        models,
        strategy=strategy,
        ref=plan.ref,
        critic=plan.critic,
        owns_weights=owns_weights,
        on_gpu=on_gpu,
        gpu_total=gpu_total,
    )
    report.estimate = estimate
    report.checkpoint = checkpoint_bytes(config, models)
    _verdicts(report, config, estimate, on_gpu)
    _vllm_cpu_head(report, config, actor, on_gpu)


def _value_config(hf_config: Any) -> Any:
    """The critic's config: the causal LM's with one label (as ``load_value_model`` sets it)."""
    import copy

    value = copy.deepcopy(hf_config)
    value.num_labels = 1
    return value


def _verdicts(report: Report, config: Any, estimate: Estimate, on_gpu: bool) -> None:
    machine = report.machine
    needed = int(config.trainer.n_gpus_per_node) if config.trainer.backend == "ray" else 1
    have = {
        "gpu": min((g.free for g in machine.gpus[:needed]), default=None) if machine.gpus else None,
        "cpu": None if report.planned else machine.ram_for_run,
    }
    for device in estimate.devices():
        need, phase = estimate.peak(device)
        verdict = Verdict(device, need, phase, have[device])
        report.verdicts.append(verdict)
        if verdict.have is None:
            continue
        where = "per GPU" if device == "gpu" else "CPU memory"
        if not verdict.fits:
            report.failures.append(
                f"memory: the estimate needs {fmt_bytes(need)} {where} at its peak ({PHASE_NAMES.get(phase, phase)}), "
                f"{fmt_bytes(verdict.have)} available"
            )
            held = estimate.held_throughout(device)
            if held > verdict.have:
                report.knobs += state_knobs(config, on_gpu)
            fp = report.batches.passes.get(phase) if report.batches else None
            report.knobs += phase_knobs(config, phase, bool(fp and fp.budgeted))
        elif verdict.tight:
            report.warnings.append(
                f"memory: {fmt_bytes(need)} {where} of {fmt_bytes(verdict.have)} is within the estimate's "
                f"+-{ACCURACY:.0%}: it may not fit"
            )
    report.knobs = list(dict.fromkeys(report.knobs))


def _vllm_cpu_head(report: Report, config: Any, actor: ModelShape, on_gpu: bool) -> None:
    """vLLM's CPU attention takes a few head sizes only; the run would fail at its first generate."""
    if config.actor_rollout_ref.rollout.name != "vllm" or on_gpu:
        return
    from verl.workers.rollout.vllm import CPU_HEAD_DIMS

    if actor.head_dim not in CPU_HEAD_DIMS:
        report.failures.append(
            f"rollout: rollout.name=vllm on a CPU: the model's attention heads are {actor.head_dim} wide, vLLM's CPU "
            f"attention takes {', '.join(map(str, CPU_HEAD_DIMS))}; use actor_rollout_ref.rollout.name=fast"
        )


def _check_disks(report: Report, config: Any, resolved: Any, prepare_plan: Any) -> None:
    where = {"run directory (trainer.default_local_dir)": str(config.trainer.default_local_dir)}
    if prepare_plan is not None and prepare_plan.artifacts():
        where["artifacts (prepare.cache_dir)"] = str(config.prepare.cache_dir)
    for what, path in where.items():
        _, free = disk_free(path)
        report.disks.append((what, path, free))
    if report.checkpoint is not None and int(config.trainer.save_freq) > 0:
        size = report.checkpoint
        free = report.disks[0][2]
        line = f"one checkpoint (trainer.save_freq={config.trainer.save_freq}) is about {fmt_bytes(size)}"
        report.disks.append(("checkpoint size", line, free))
        if size > free:
            report.warnings.append(
                f"disk: {line}, {fmt_bytes(free)} free in {config.trainer.default_local_dir}"
            )


def _machine_warnings(report: Report, config: Any, machine: Machine) -> None:
    arr = config.actor_rollout_ref
    if report.device == "cpu" and dtype_bytes(arr.model.torch_dtype) == 2 and not machine.cpu.bf16_fast:
        report.warnings.append(
            f"cpu: actor_rollout_ref.model.torch_dtype={arr.model.torch_dtype} without avx512_bf16 or AMX: bf16 "
            "is emulated on this CPU, slower than float32"
        )
    threads = config.trainer.torch_threads
    if isinstance(threads, int) and threads > machine.cores:
        report.warnings.append(f"cpu: trainer.torch_threads={threads} but {machine.cores} cores are usable")
    for row in report.packages:
        if row.status == UNTESTED and row.installed:
            report.warnings.append(f"environment: {row.name} {row.installed} is untested ({row.advice})")

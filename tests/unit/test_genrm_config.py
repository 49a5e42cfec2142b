"""The generative reward model's configuration: verl's rule choosing it (a custom reward function with
reward_model.enable), verl's reward.reward_model.rollout.* and legacy reward_model.rollout.* keys read onto
reward_model.rollout, what is refused or reported and why, and the start-up checks of its inputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_reward_model import save_tiny_reward_model
from verl.config import ConfigError, load_config
from verl.config.genrm import serves_genrm
from verl.config.verl_compat import notices
from verl.errors import InputError
from verl.models import make_tiny_model
from verl.workers.reward.genrm import client_kwargs
from verl.workers.reward.model import check_reward_model_inputs

CLIENT = """
async def judge(data_source, solution_str, ground_truth, extra_info=None, reward_router_address=None,
                reward_model_tokenizer=None):
    return 0.0

def rule(data_source, solution_str, ground_truth, extra_info=None):
    return 0.0
"""


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("client") / "client.py"
    path.write_text(CLIENT)
    return path


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory) -> Path:
    return make_tiny_model(
        tmp_path_factory.mktemp("lm"), hidden_size=16, num_hidden_layers=1, intermediate_size=32
    )


def genrm(client: Path, model: Path | str = "/rm", *extra: str, recipe: str = "grpo", check: bool = True):
    overrides = ["reward_model.enable=true", f"reward_model.model.path={model}"]
    overrides += [f"custom_reward_function.path={client}", "custom_reward_function.name=judge"]
    return load_config(recipe, [*overrides, *extra], check=check)


def test_a_custom_function_makes_the_reward_model_generative_as_in_verl(client) -> None:
    assert serves_genrm(genrm(client))
    assert not serves_genrm(load_config("grpo", ["reward_model.enable=true", "reward_model.model.path=/rm"]))
    assert not serves_genrm(load_config("grpo", [f"custom_reward_function.path={client}"]))
    # reward_fns naming the reward_model term asks for a discriminative score: the function is the rule term
    terms = "reward_model.reward_fns=[correctness,{name: reward_model, weight: 0.5}]"
    assert not serves_genrm(genrm(client, "/rm", terms))


def test_verls_rollout_keys_of_the_reward_model_act(client) -> None:
    cfg = load_config(
        "ppo_trainer",
        [
            "reward.reward_model.enable=true",
            "reward.reward_model.model_path=/rm",
            f"reward.custom_reward_function.path={client}",
            "reward.custom_reward_function.name=judge",
            "reward.reward_model.rollout.name=hf",
            "reward.reward_model.rollout.temperature=0.6",
            "reward.reward_model.rollout.top_p=0.8",
            "reward.reward_model.rollout.response_length=64",
            "reward.reward_model.rollout.max_num_seqs=16",
            "+reward.reward_model.rollout.engine_kwargs.vllm.swap_space=4",
            "reward.reward_model.rollout.tensor_model_parallel_size=2",
            "reward.reward_model.enable_resource_pool=true",
            "data.train_files=x",
        ],
        check=False,
    )
    section = cfg.reward_model.rollout
    assert (section.name, section.temperature, section.top_p, section.response_length) == ("hf", 0.6, 0.8, 64)
    assert section.max_num_seqs == 16 and dict(section.engine_kwargs.vllm) == {"swap_space": 4}
    lines = "\n".join(notices(cfg))
    assert "reward.reward_model.rollout.tensor_model_parallel_size=2" in lines
    assert (
        "reward.reward_model.enable_resource_pool=true" in lines and "one server runs in the trainer" in lines
    )
    # verl 0.7's top-level spelling is the key itself; two spellings at odds are an error naming both
    assert genrm(client, "/rm", "reward_model.rollout.dtype=bf16").reward_model.rollout.dtype == "bf16"
    with pytest.raises(ConfigError, match="two spellings of one setting"):
        genrm(
            client,
            "/rm",
            "reward.reward_model.rollout.temperature=0.5",
            "reward_model.rollout.temperature=0.7",
        )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("reward.reward_model.rollout.skip_tokenizer_init=true", "needs its tokenizer"),
        ("reward_model.rollout.skip_tokenizer_init=true", "needs its tokenizer"),
        ("reward.reward_model.rollout.quantization=fp8", "a quantized reward model is not built"),
        ("reward.reward_model.rollout.load_format=dummy", "dummy: random weights"),
        ("reward_model.rollout.top_p=0", "reward_model.rollout.top_p must be in (0, 1]"),
        ("reward_model.rollout.temperature=-1", "reward_model.rollout.temperature must be >= 0"),
        ("reward_model.rollout.max_num_seqs=0", "reward_model.rollout.max_num_seqs must be >= 1"),
        ("reward_model.rollout.dtype=fp8", "reward_model.rollout.dtype must be one of"),
        ("reward_model.rollout.name=fsat", "reward_model.rollout.name must be one of fast"),
        ("reward_model.micro_batch_size_per_gpu=4", "reward_model.micro_batch_size_per_gpu=4 is read by a "
         "discriminative reward model only"),
        ("reward_model.max_length=64", "reward_model.max_length=64 is read by a discriminative"),
    ],
)  # fmt: skip
def test_what_cannot_be_honoured_is_refused_with_the_reason(client, override, message) -> None:
    with pytest.raises(ConfigError) as info:
        genrm(client, "/rm", override, recipe="ppo_trainer" if override.startswith("reward.") else "grpo")
    assert message in str(info.value)


def test_an_inference_engine_that_is_not_installed_maps_onto_fast(client, monkeypatch) -> None:
    import verl.config.verl_compat as compat

    monkeypatch.setattr(compat, "engine_installed", lambda name: False)
    cfg = genrm(client, "/rm", "reward_model.rollout.name=vllm")
    assert (
        cfg.reward_model.rollout.name == "fast" and cfg.compat.mapped["reward_model.rollout.name"] == "vllm"
    )
    assert any("vLLM is not installed" in line and "generates with reward_model.rollout.name=fast" in line
               for line in notices(cfg))  # fmt: skip
    trt = genrm(
        client, "/rm", "reward_model.rollout.name=trtllm", "reward_model.rollout.gpu_memory_utilization=0.6"
    )
    assert trt.reward_model.rollout.name == "fast"
    unread = "reward_model.rollout.gpu_memory_utilization=0.6: read by the vllm and sglang engine only"
    assert any(unread in line for line in notices(trt))
    # a discriminative reward model reads none of it: kept as asked, and said so
    disrm = load_config(
        "grpo", ["reward_model.enable=true", "reward_model.model.path=/rm", "reward_model.rollout.name=vllm"]
    )
    assert disrm.reward_model.rollout.name == "vllm"
    assert any("reward_model.rollout.name=vllm: read only when the reward model is generative" in line
               for line in notices(disrm))  # fmt: skip


def test_start_up_checks_name_the_key(client, lm_dir, tmp_path) -> None:
    check_reward_model_inputs(genrm(client, lm_dir))  # a causal LM and a client function: fine
    classifier = save_tiny_reward_model(tmp_path / "classifier")
    with pytest.raises(
        InputError, match=r"reward_model.model.path=.*must be a causal LM.*ForSequenceClassification"
    ):
        check_reward_model_inputs(genrm(client, classifier))
    with pytest.raises(InputError, match="reward_model.model.path=.*does not exist"):
        check_reward_model_inputs(genrm(client, tmp_path / "nowhere"))
    rule = genrm(client, lm_dir, "custom_reward_function.name=rule")
    with pytest.raises(InputError, match="takes neither reward_router_address nor reward_model_tokenizer"):
        check_reward_model_inputs(rule)
    with pytest.raises(ValueError, match="no server address was given"):
        client_kwargs(genrm(client, lm_dir), None)
    assert client_kwargs(load_config("grpo"), None) == {}  # no generative reward model: nothing to bind

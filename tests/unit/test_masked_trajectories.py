"""Multi-turn trajectories: a response is sampled tokens (response_mask 1) interleaved with inserted tool / user
tokens (response_mask 0, attention_mask 1), then right padding (both 0). Everything downstream of the rollout
must read the right mask: the scorer decodes the whole trajectory but the reward sits on the last sampled token,
lengths count the trajectory, advantages skip the inserted tokens, the forward passes see them (attention) but
score only the sampled ones, and the loss has no gradient through them.

Row patterns (response width 10; a = sampled, T = inserted, . = padding):

* ``aaaTTTaa..``: two assistant turns around a tool output;
* ``aaTTT.....``: the trajectory ends with a tool output (cut at the turn limit);
* ``aaaa......``: single turn;
* ``aTTaTTTTaa``: two tool outputs, full width, the last sampled token in the last column;
* ``aaaaaaa...``: single turn, the most sampled tokens of any row.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from verl.algorithms import get_adv_estimator_fn
from verl.config.schema import ActorConfig
from verl.models import load_hf_model, load_value_model
from verl.protocol import DataProto
from verl.trainer.metrics import compute_data_metrics
from verl.workers.actor import Actor, loss_context
from verl.workers.engine.optim import build_optimizer
from verl.workers.engine.packing import pack, packed_attention_implementation
from verl.workers.engine.scoring import PolicyScorer, ValueScorer
from verl.workers.reward.combine import RewardFunction, response_positions
from verl.workers.reward.dapo import DAPORewardManager
from verl.workers.reward.manager import NaiveRewardManager
from verl.workers.reward.model import RewardModelScorer

PATTERNS = ["aaaTTTaa..", "aaTTT.....", "aaaa......", "aTTaTTTTaa", "aaaaaaa..."]
RESPONSE_MASK = torch.tensor([[float(c == "a") for c in p] for p in PATTERNS])
ATTENTION = torch.tensor([[int(c != ".") for c in p] for p in PATTERNS])
LAST_SAMPLED = [7, 1, 3, 9, 6]
TRAJECTORY_LENGTHS = [8, 5, 4, 10, 7]


# ------------------------------------------------------------------------------------------------ reward
CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
PAD = 0


class CharTokenizer:
    """id 0 pads (a special token); id k > 0 is CHARS[k - 1]."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(CHARS[i - 1] for i in list(ids) if not (skip_special_tokens and i == PAD))


def reward_batch() -> tuple[DataProto, list[str]]:
    """Sampled tokens spell lower-case letters, inserted ones upper-case; each row's whole trajectory text."""
    ids = torch.zeros(RESPONSE_MASK.shape, dtype=torch.long)
    texts = []
    for row, pattern in enumerate(PATTERNS):
        text = "".join(
            (CHARS[(row + t) % 26] if c == "a" else CHARS[26 + (row + t) % 26])
            for t, c in enumerate(pattern)
            if c != "."
        )
        ids[row, : len(text)] = torch.tensor([CHARS.index(c) + 1 for c in text])
        texts.append(text)
    prompts = torch.tensor([[PAD, 1, 2]] * len(PATTERNS))
    prompt_mask = (prompts != PAD).long()
    data = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": ids,
            "input_ids": torch.cat([prompts, ids], dim=1),
            "attention_mask": torch.cat([prompt_mask, ATTENTION], dim=1),
            "response_mask": RESPONSE_MASK.clone(),
        },
        non_tensors={
            "data_source": np.array(["x"] * len(PATTERNS), dtype=object),
            "reward_model": np.array([{"ground_truth": "1"}] * len(PATTERNS), dtype=object),
            "raw_prompt": np.array([[{"role": "user", "content": "q"}]] * len(PATTERNS), dtype=object),
        },
    )
    return data, texts


def test_the_scorer_sees_the_whole_trajectory_and_the_reward_sits_on_the_last_sampled_token() -> None:
    data, texts = reward_batch()
    seen = []

    def score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(solution_str)
        return 1.0

    reward = NaiveRewardManager(CharTokenizer(), compute_score=score)(data)
    assert seen == texts
    assert seen[0] == "abcDEFgh"  # the tool output (upper case) between the two turns is in it
    assert [len(t) for t in texts] == TRAJECTORY_LENGTHS
    expected = torch.zeros(RESPONSE_MASK.shape)
    expected[torch.arange(len(PATTERNS)), torch.tensor(LAST_SAMPLED)] = 1.0
    assert torch.equal(reward, expected)
    assert (reward * (1 - RESPONSE_MASK)).abs().sum() == 0  # never on an inserted token


def test_dapo_counts_the_trajectory_and_penalises_at_the_reward_position() -> None:
    data, _ = reward_batch()
    buffer = OmegaConf.create({"enable": True, "len": 4, "penalty_factor": 1.0})
    manager = DAPORewardManager(
        CharTokenizer(), compute_score=lambda **kw: 1.0, max_resp_len=10, overlong_buffer=buffer
    )
    out = manager(data, return_dict=True)
    # L_exp = 10 - 4 = 6: penalty = min(-(L - 6) / 4, 0) with L the trajectory length [8, 5, 4, 10, 7]
    penalties = [-0.5, 0.0, 0.0, -1.0, -0.25]
    assert out["reward_extra_info"]["overlong_reward"] == penalties
    assert out["reward_extra_info"]["overlong"] == [True, False, False, True, True]
    expected = torch.zeros(RESPONSE_MASK.shape)
    expected[torch.arange(len(PATTERNS)), torch.tensor(LAST_SAMPLED)] = 1.0 + torch.tensor(penalties)
    assert torch.equal(out["reward_tensor"], expected)


def test_batch_terms_and_the_reward_model_use_the_same_positions_and_lengths() -> None:
    data, texts = reward_batch()
    positions, lengths = response_positions(data)
    assert positions.tolist() == LAST_SAMPLED
    assert lengths.tolist() == TRAJECTORY_LENGTHS
    rm = torch.tensor([0.5, -1.0, 2.0, 0.25, 1.5])
    reward = RewardFunction(NaiveRewardManager(CharTokenizer()), reward_model=lambda d: rm)(data)
    expected = torch.zeros(RESPONSE_MASK.shape)
    expected[torch.arange(len(PATTERNS)), torch.tensor(LAST_SAMPLED)] = rm
    assert torch.equal(reward, expected)
    # What the reward model reads: the whole trajectory as the assistant's message, as verl decodes it.
    scorer = RewardModelScorer.__new__(RewardModelScorer)
    scorer.input_tokenizer = CharTokenizer()
    chats = scorer.chats(data)
    assert [chat[-1] for chat in chats] == [{"role": "assistant", "content": t} for t in texts]


def test_response_length_metrics_are_the_trajectory_lengths() -> None:
    rows, width = RESPONSE_MASK.shape
    prompt_mask = torch.tensor([[0, 1, 1]] * rows)
    advantages = torch.where(RESPONSE_MASK.bool(), 1.0, 100.0)  # garbage where nothing is trained
    batch = DataProto.from_dict(
        tensors={
            "response_mask": RESPONSE_MASK,
            "attention_mask": torch.cat([prompt_mask, ATTENTION], dim=1),
            "token_level_scores": torch.zeros(rows, width),
            "token_level_rewards": torch.zeros(rows, width),
            "advantages": advantages,
            "returns": advantages,
        }
    )
    metrics = compute_data_metrics(batch, max_response_length=10)
    assert metrics["response_length/mean"] == pytest.approx(sum(TRAJECTORY_LENGTHS) / rows)
    assert metrics["response_length/max"] == 10 and metrics["response_length/min"] == 4
    assert metrics["response_length/clip_ratio"] == pytest.approx(1 / rows)
    assert metrics["prompt_length/mean"] == 2
    assert metrics["critic/advantages/max"] == 1.0  # over the trained tokens only


# ------------------------------------------------------------------------------------------------ advantages
HOLE = torch.tensor([[1.0, 1, 1, 0, 0, 0, 1, 1, 0, 0]])
NO_HOLE = torch.tensor([[1.0, 1, 1, 1, 1, 0, 0, 0, 0, 0]])  # the same sampled tokens, the hole taken out
SAMPLED = HOLE[0].bool()


def _fill(sampled_values: list[float], masked_value: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The 5 sampled tokens' values laid out with the hole (masked positions = masked_value) and without."""
    with_hole = torch.full((1, 10), masked_value)
    with_hole[0, SAMPLED] = torch.tensor(sampled_values, dtype=torch.float32)
    without = torch.zeros(1, 10)
    without[0, :5] = torch.tensor(sampled_values, dtype=torch.float32)
    return with_hole, without


def test_gae_skips_the_inserted_tokens() -> None:
    gae = get_adv_estimator_fn("gae")
    # Hand-checkable: V = 0, reward 1 on the last sampled token, gamma = 0.5, lam = 1: the returns halve at
    # each sampled token going back, the 3 tool tokens cost no discount step.
    rewards, _ = _fill([0, 0, 0, 0, 1], 0.0)
    _, returns = gae(
        token_level_rewards=rewards, values=torch.zeros(1, 10), response_mask=HOLE, gamma=0.5, lam=1.0
    )
    assert returns.tolist() == [[0.0625, 0.125, 0.25, 0, 0, 0, 0.5, 1.0, 0, 0]]
    # In general: the same as GAE on the sequence with the hole removed, whatever the rewards and values at
    # the inserted tokens (a reward there is lost: the reward managers never put one there).
    rewards = torch.tensor([0.3, -0.2, 0.0, 0.1, 1.0])
    values = torch.tensor([0.5, 0.1, -0.4, 0.7, 0.2])
    second = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]])  # a second row, both layouts
    results = []
    for masked_value in (0.0, 7.0):
        (r_hole, r_plain), (v_hole, v_plain) = (
            _fill(rewards.tolist(), masked_value),
            _fill(values.tolist(), -3.0),
        )

        def with_second_row(r: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> tuple:
            return gae(
                token_level_rewards=torch.cat([r, second]),
                values=torch.cat([v, second]),
                response_mask=torch.cat([mask, torch.ones(1, 10)]),
                gamma=0.9,
                lam=0.8,
            )

        hole = with_second_row(r_hole, v_hole, HOLE)
        plain = with_second_row(r_plain, v_plain, NO_HOLE)
        for with_hole, without in zip(hole, plain, strict=True):
            torch.testing.assert_close(with_hole[0, SAMPLED], without[0, :5], atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(with_hole[1], without[1], atol=1e-6, rtol=1e-6)
            assert (with_hole[0, ~SAMPLED] == 0).all()
        results.append(hole)
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)  # the masked rewards change nothing


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus", "remax"])
def test_return_to_go_estimators_skip_the_inserted_tokens(estimator) -> None:
    fn = get_adv_estimator_fn(estimator)
    kwargs = {"gamma": 0.5} if estimator == "reinforce_plus_plus" else {"reward_baselines": torch.zeros(1)}
    for masked_value in (0.0, 4.0):
        rewards, plain_rewards = _fill([0, 0, 0, 0, 1], masked_value)
        _, returns = fn(token_level_rewards=rewards, response_mask=HOLE, **kwargs)
        _, plain = fn(token_level_rewards=plain_rewards, response_mask=NO_HOLE, **kwargs)
        assert torch.equal(returns[0, SAMPLED], plain[0, :5])
        assert (returns[0, ~SAMPLED] == 0).all()
    if estimator == "reinforce_plus_plus":  # the tokens before the tool output keep the outcome reward
        assert returns.tolist() == [[0.0625, 0.125, 0.25, 0, 0, 0, 0.5, 1.0, 0, 0]]


# ------------------------------------------------------------------------------------------------ forward passes
PROMPT_WIDTH = 5


def model_batch(vocab_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Three prompts (left-padded, lengths 5, 3, 4), each answered by the row patterns above in turn."""
    g = torch.Generator().manual_seed(seed)
    rows, width = RESPONSE_MASK.shape
    groups = torch.tensor([0, 0, 1, 1, 2])
    prompts = torch.randint(3, vocab_size, (3, PROMPT_WIDTH), generator=g)
    prompt_mask = torch.ones(3, PROMPT_WIDTH, dtype=torch.long)
    for group, length in enumerate([5, 3, 4]):
        prompt_mask[group, : PROMPT_WIDTH - length] = 0
    responses = torch.randint(3, vocab_size, (rows, width), generator=g) * ATTENTION
    input_ids = torch.cat([prompts[groups], responses], dim=1)
    attention_mask = torch.cat([prompt_mask[groups], ATTENTION], dim=1)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp_min(0),
        "responses": responses,
        "response_mask": RESPONSE_MASK.clone(),
    }


def full_forward_log_probs(
    model: torch.nn.Module, b: dict[str, torch.Tensor], temperature: float
) -> torch.Tensor:
    """log p of every response token from one plain forward pass of the whole padded batch."""
    logits = model(
        input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
    ).logits
    logits = logits[:, PROMPT_WIDTH - 1 : -1].float() / temperature
    return F.log_softmax(logits, -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


SCORERS = [
    pytest.param({}, id="padded"),
    pytest.param({"remove_padding": True}, id="remove_padding"),
    pytest.param({"remove_padding": True, "chunk_size": 3}, id="remove_padding-chunked"),
    pytest.param({"share_prompts": True}, id="share_prompts"),
    pytest.param({"share_prompts": True, "chunk_size": 4}, id="share_prompts-chunked"),
]


def load_for(model_dir, options: dict) -> torch.nn.Module:
    attn = packed_attention_implementation("sdpa") if options.get("remove_padding") else "eager"
    return load_hf_model(model_dir, attn_implementation=attn)


@pytest.mark.parametrize("options", SCORERS)
def test_policy_log_probs_with_holes_equal_a_full_forward_pass(tiny_model_dir, options) -> None:
    reference = load_hf_model(tiny_model_dir, attn_implementation="eager")
    model = load_for(tiny_model_dir, options)
    b = model_batch(model.config.vocab_size)
    mask = b["response_mask"]
    expected = full_forward_log_probs(reference, b, temperature=0.8) * mask
    (expected.sum()).backward()
    log_probs, entropy = PolicyScorer(model, **options)(
        b["input_ids"], b["attention_mask"], b["position_ids"], b["responses"], mask, 0.8, True
    )
    log_probs.sum().backward()
    torch.testing.assert_close(log_probs, expected, atol=1e-5, rtol=1e-5)
    assert (log_probs[mask == 0] == 0).all() and (entropy[mask == 0] == 0).all()
    assert (entropy[mask == 1] > 0).all()
    want, got = grads(reference), grads(model)
    assert want.keys() == got.keys() and len(want) > 0
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=1e-4)


def test_values_with_holes_packed_equal_padded(tiny_model_dir) -> None:
    padded = load_value_model(tiny_model_dir, attn_implementation="eager")
    packed = load_value_model(tiny_model_dir, attn_implementation=packed_attention_implementation("sdpa"))
    packed.load_state_dict(padded.state_dict())  # the value head is new, random: share it
    b = model_batch(padded.config.vocab_size)
    args = (b["input_ids"], b["attention_mask"], b["position_ids"], b["response_mask"])
    a = ValueScorer(padded)(*args)
    with torch.no_grad():
        full = padded(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
        )
    expected = full.logits[:, PROMPT_WIDTH - 1 : -1, 0] * b["response_mask"]
    torch.testing.assert_close(a, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ValueScorer(packed, remove_padding=True)(*args), a, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------ the actor's loss
def actor_config(**keys):
    base = {
        "use_kl_loss": True,
        "kl_loss_coef": 0.1,
        "kl_loss_type": "low_var_kl",
        "entropy_coeff": 0.01,
        "shuffle": False,
        "optim": {"lr": 1e-3, "lr_warmup_steps": 0},
        **keys,
    }
    return OmegaConf.merge(OmegaConf.structured(ActorConfig), base)


def actor_batch(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model batch plus what an update reads: advantages (GAE of an outcome reward through the holes),
    old log-probs near the model's own (ratios not all clipped), reference log-probs."""
    b = model_batch(model.config.vocab_size)
    g = torch.Generator().manual_seed(1)
    mask = b["response_mask"]
    rows = len(mask)
    rewards = torch.zeros_like(mask)
    rewards[torch.arange(rows), torch.tensor(LAST_SAMPLED)] = torch.tensor([1.0, -1.0, 0.5, 1.0, -0.5])
    values = 0.3 * torch.randn(mask.shape, generator=g) * mask
    b["advantages"], _ = get_adv_estimator_fn("gae")(
        token_level_rewards=rewards, values=values, response_mask=mask, gamma=1.0, lam=0.95
    )
    with torch.no_grad():
        own = full_forward_log_probs(model, b, temperature=1.0) * mask
    b["old_log_probs"] = (own + 0.05 * torch.randn(mask.shape, generator=g)) * mask
    b["ref_log_prob"] = (own + 0.2 * torch.randn(mask.shape, generator=g)) * mask
    b["_rewards"], b["_values"] = rewards, values
    return b


def scrambled(b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``b`` with other rewards / values (so other advantages), old and reference log-probs at every token
    that is not trained on (inserted tool tokens and padding)."""
    g = torch.Generator().manual_seed(2)
    off = b["response_mask"] == 0
    out = dict(b)
    for key in ("old_log_probs", "ref_log_prob", "_rewards", "_values"):
        out[key] = torch.where(off, 3.0 * torch.randn(off.shape, generator=g), b[key])
    advantages, _ = get_adv_estimator_fn("gae")(
        token_level_rewards=out["_rewards"],
        values=out["_values"],
        response_mask=b["response_mask"],
        gamma=1.0,
        lam=0.95,
    )
    assert torch.equal(advantages, b["advantages"])  # GAE ignores rewards and values at masked tokens ...
    out["advantages"] = torch.where(
        off, 5.0 * torch.randn(off.shape, generator=g), advantages
    )  # ... and more
    return out


def micro_loss(actor: Actor, b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    data = DataProto.from_dict(tensors={k: v for k, v in b.items() if not k.startswith("_")})
    mask = b["response_mask"]
    context = loss_context(actor.config, 1.0, float(mask.sum()), float(len(mask)))
    metrics: dict[str, float] = defaultdict(float)
    loss = actor.micro_batch_loss(data, context, metrics, temperature=1.0, use_entropy=True)
    return loss, dict(metrics)


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("options", SCORERS[:2] + SCORERS[3:4])
def test_the_loss_has_no_gradient_through_inserted_tokens(tiny_model_dir, options, loss_agg_mode) -> None:
    """Masking test: the gradient of the actor's loss w.r.t. the final hidden states (so the logits) is exactly
    zero at every position that predicts an inserted or padding token, nonzero where it predicts a sampled
    one; whatever the old log-probs, advantages or rewards at the inserted tokens, the loss and the gradients
    are the same."""
    model = load_for(tiny_model_dir, options)
    actor = Actor(model, actor_config(loss_agg_mode=loss_agg_mode), **options)
    b = actor_batch(model)
    mask = b["response_mask"]
    rows, width = b["input_ids"].shape

    hidden, head_rows = [], []

    def keep_hidden(module, args, out):
        out[0].retain_grad()
        hidden.append(out[0])

    decoder_hook = model.get_decoder().register_forward_hook(keep_hidden)
    head_hook = model.get_output_embeddings().register_forward_hook(
        lambda m, args, out: head_rows.append(out.shape[0])
    )
    results = []
    for batch in (b, scrambled(b)):
        model.zero_grad()
        hidden.clear()
        head_rows.clear()
        loss, metrics = micro_loss(actor, batch)
        loss.backward()
        results.append((loss.detach(), metrics, grads(model), [h.grad for h in hidden]))
    decoder_hook.remove()
    head_hook.remove()

    # Only the positions that predict a sampled token reach the LM head: no logits at all for the others.
    assert sum(head_rows) == int(mask.sum())
    (loss_a, metrics_a, grads_a, hidden_a), (loss_b, metrics_b, grads_b, hidden_b) = results
    assert torch.isfinite(loss_a) and loss_a != 0
    assert torch.equal(loss_a, loss_b) and metrics_a == metrics_b
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 0
    for name in grads_a:
        assert torch.equal(grads_a[name], grads_b[name]), name

    if options.get("share_prompts"):
        return  # two decoder passes (prompts, responses): the positions are checked in the other layouts
    (grad,) = hidden_a
    if options.get("remove_padding"):  # the packed [1, T, hidden] back onto the padded grid
        packed = pack(b["input_ids"], b["attention_mask"], b["position_ids"])
        full = grad.new_zeros(rows * width, grad.shape[-1])
        full[packed.token_index] = grad[0]
        grad = full.view(rows, width, -1)
    # Position PROMPT_WIDTH - 1 + t predicts response token t.
    predicting = grad[:, PROMPT_WIDTH - 1 : -1].abs().sum(-1)
    assert (predicting[mask == 0] == 0).all()
    assert (predicting[mask == 1] > 0).all()
    assert (grad[:, -1] == 0).all()  # the last position predicts nothing


def test_an_update_is_the_same_whatever_the_inserted_tokens_hold(tiny_model_dir) -> None:
    """The whole update (mini-batches, micro-batches by token budget, the optimizer step) on a batch with holes
    moves the weights, and exactly as much whatever the old log-probs, advantages and rewards at the inserted
    tokens."""
    weights = []
    for scramble in (False, True):
        model = load_hf_model(tiny_model_dir, attn_implementation="eager")
        cfg = actor_config()
        actor = Actor(model, cfg, build_optimizer(model.parameters(), cfg.optim), seed=0)
        b = actor_batch(model)
        b = scrambled(b) if scramble else b
        data = DataProto.from_dict(tensors={k: v for k, v in b.items() if not k.startswith("_")})
        before = {k: v.detach().clone() for k, v in model.state_dict().items()}
        metrics = actor.update_policy(
            data, mini_batch_size=5, micro_batch_size=None, temperature=1.0, max_tokens=32
        )
        after = {k: v.detach().clone() for k, v in model.state_dict().items()}
        assert max((after[k] - before[k]).abs().max().item() for k in before) > 0
        weights.append((after, metrics))
    (a, metrics_a), (b_, metrics_b) = weights
    assert metrics_a == metrics_b
    for name in a:
        assert torch.equal(a[name], b_[name]), name

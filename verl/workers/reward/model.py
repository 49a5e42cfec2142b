"""The discriminative reward model (``reward_model.enable=true`` without ``custom_reward_function.path``; with one it
is generative and served, :mod:`verl.workers.reward.genrm`): a sequence-classification model scoring each response.

What verl's ``RewardModelWorker`` does (``_switch_chat_template`` + ``compute_rm_score`` in
verl/workers/fsdp_workers.py), on the reward worker's device:

1. the chat: the prompt's messages (the row's ``raw_prompt``; without it, the decoded prompt as one user message)
   plus ``{"role": "assistant", "content": <response>}``, the response decoded with the input tokenizer
   (``reward_model.model.input_tokenizer``, by default the policy's), special and pad tokens skipped; the
   response is every response token of the attention mask, so a multi-turn trajectory's tool outputs are in
   that one message, as in verl;
2. formatted with the reward model's own chat template (plain concatenation, prompt then response, when its
   tokenizer has none), tokenized with the reward model's tokenizer, cut to ``reward_model.max_length`` tokens
   from the right (the end is dropped, verl's ``truncation="right"``);
3. run in micro-batches of ``reward_model.micro_batch_size_per_gpu``, right-padded; the score is ``logits[:, 0]``
   as the model pools it (transformers' ``*ForSequenceClassification`` reads the last token that is not
   ``config.pad_token_id``, which is always set here).

verl with ``input_tokenizer: null`` feeds the policy's token ids to the reward model unchanged, which is right
only when both share tokenizer and chat template; here the text is always re-templated, which gives the same
input in that case and the right one otherwise.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, PreTrainedModel

from verl.config.genrm import serves_genrm
from verl.errors import InputError
from verl.models.loading import check_model_dir, load_tokenizer
from verl.protocol import DataProto
from verl.workers.reward.masks import trajectory_mask

logger = logging.getLogger(__name__)

PATH_KEY = "reward_model.model.path"
TOKENIZER_KEY = "reward_model.model.input_tokenizer"


def check_reward_model_inputs(config: Any) -> None:
    """At start-up, before anything loads: the reward model's directory (config.json and tokenizer files) and
    the input tokenizer's, each an error naming its key; a generative reward model's own checks
    (:func:`verl.workers.reward.genrm.check_genrm_inputs`)."""
    section = config.reward_model
    if not section.enable:
        return
    if serves_genrm(config):
        from verl.workers.reward.genrm import check_genrm_inputs

        check_genrm_inputs(config)
        return
    check_model_dir(section.model.path, PATH_KEY, need_tokenizer=True)
    if section.model.input_tokenizer:
        check_model_dir(section.model.input_tokenizer, TOKENIZER_KEY, need_config=False, need_tokenizer=True)


def load_reward_model(path: str, trust_remote_code: bool = False) -> PreTrainedModel:
    """``AutoModelForSequenceClassification`` with one label, in eval mode; a checkpoint without a trained
    score head (a causal LM, whose head would be random) is an InputError naming the key."""
    source = check_model_dir(path, PATH_KEY, need_tokenizer=True)
    config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    config.num_labels = 1
    try:
        model, info = AutoModelForSequenceClassification.from_pretrained(
            source, config=config, trust_remote_code=trust_remote_code, output_loading_info=True
        )
    except (OSError, ValueError, RuntimeError) as exc:
        raise InputError(f"{PATH_KEY}={path}: cannot load it as a reward model ({exc})") from exc
    missing = list(info.get("missing_keys", []))
    if missing:
        raise InputError(
            f"{PATH_KEY}={path}: not a reward model checkpoint: no weights for {', '.join(sorted(missing)[:3])} "
            "(a causal LM loaded as AutoModelForSequenceClassification gets a random score head; to judge with a "
            "causal LM, set custom_reward_function.path to a function that calls it: it is then served as a "
            "generative reward model, as in verl)"
        )
    return model.eval()


def _message_list(raw: Any) -> list[dict[str, Any]]:
    return [dict(m) for m in list(raw)]


class RewardModelScorer:
    """Scores a batch with the reward model: ``scorer(data)`` is one float32 score per sample (on the CPU).

    ``policy_tokenizer`` decodes the responses unless ``reward_model.model.input_tokenizer`` names another;
    ``max_length`` is the default of ``reward_model.max_length``.
    """

    def __init__(self, section: Any, policy_tokenizer: Any, device: torch.device, max_length: int) -> None:
        model_cfg = section.model
        trust = bool(model_cfg.trust_remote_code)
        self.tokenizer = load_tokenizer(model_cfg.path, trust, key=PATH_KEY)
        self.input_tokenizer = (
            load_tokenizer(model_cfg.input_tokenizer, trust, key=TOKENIZER_KEY)
            if model_cfg.input_tokenizer
            else policy_tokenizer
        )
        self.model = load_reward_model(model_cfg.path, trust).to(device)
        self.device = device
        self.max_length = int(section.max_length or max_length)
        self.micro_batch_size = section.micro_batch_size_per_gpu
        self.pad_token_id = self._pad_token_id()
        self._warned_pad = False

    def _pad_token_id(self) -> int:
        """The model's ``pad_token_id``, set from its tokenizer's when the config has none (the pooling needs it;
        a tokenizer without a pad token pads with its eos, see :func:`verl.models.loading.ensure_pad_token`)."""
        config = self.model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        if text_config.pad_token_id is None:
            for cfg in {id(config): config, id(text_config): text_config}.values():
                cfg.pad_token_id = self.tokenizer.pad_token_id
        return int(text_config.pad_token_id)

    def chats(self, data: DataProto) -> list[list[dict[str, Any]]]:
        """Each sample's chat: its prompt messages, then the decoded response as the assistant's turn."""
        decode = self.input_tokenizer.decode
        batch, non_tensor = data.batch, data.non_tensor_batch
        responses = batch["responses"]
        width = responses.shape[-1]
        mask = trajectory_mask(data)  # the whole trajectory, tool outputs included (as verl decodes it)
        chats = []
        for i in range(len(data)):
            if "raw_prompt" in non_tensor:
                prompt = _message_list(non_tensor["raw_prompt"][i])
            else:
                prompt_ids = batch["prompts"][i][batch["attention_mask"][i, :-width].bool()]
                prompt = [{"role": "user", "content": decode(prompt_ids.tolist(), skip_special_tokens=True)}]
            response = decode(responses[i][mask[i]].tolist(), skip_special_tokens=True)
            chats.append([*prompt, {"role": "assistant", "content": response}])
        return chats

    def texts(self, chats: Sequence[list[dict[str, Any]]]) -> list[str]:
        """The reward model's input texts: its chat template, or prompt then response as plain text."""
        if getattr(self.tokenizer, "chat_template", None):
            return [
                self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False)
                for chat in chats
            ]
        return ["\n".join(str(m["content"]) for m in chat[:-1]) + chat[-1]["content"] for chat in chats]

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids, cut to ``max_length`` from the right; a template's text already holds its special
        tokens, plain text gets the tokenizer's own."""
        special = not getattr(self.tokenizer, "chat_template", None)
        ids = [self.tokenizer(text, add_special_tokens=special)["input_ids"] for text in texts]
        cut = sum(len(x) > self.max_length for x in ids)
        if cut:
            logger.warning(
                "%d of %d reward-model inputs are longer than reward_model.max_length=%d tokens: their end is cut",
                cut,
                len(ids),
                self.max_length,
            )
        return [list(x[: self.max_length]) for x in ids]

    @torch.no_grad()
    def forward(self, ids: Sequence[list[int]]) -> torch.Tensor:
        """Scores of tokenized inputs, in micro-batches, right-padded with the model's pad token."""
        size = self.micro_batch_size or max(1, len(ids))
        scores = []
        for start in range(0, len(ids), size):
            chunk = ids[start : start + size]
            longest = max(1, max(len(x) for x in chunk))
            input_ids = torch.full((len(chunk), longest), self.pad_token_id, dtype=torch.long)
            attention_mask = torch.zeros((len(chunk), longest), dtype=torch.long)
            for row, x in enumerate(chunk):
                input_ids[row, : len(x)] = torch.tensor(x, dtype=torch.long)
                attention_mask[row, : len(x)] = 1
            self._warn_pad_inside(input_ids, attention_mask)
            logits = self.model(
                input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device)
            ).logits
            scores.append(logits[:, 0].float().cpu())
        return torch.cat(scores) if scores else torch.zeros(0)

    def _warn_pad_inside(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """The model's pooling reads the last token that is not the pad token: a real token with the pad id at
        the end of an input (a tokenizer padding with its eos) is skipped by it. Said once."""
        if self._warned_pad or not ((input_ids == self.pad_token_id) & attention_mask.bool()).any():
            return
        self._warned_pad = True
        logger.warning(
            "the reward model's inputs hold its pad token id %d as a real token: the model scores the last token "
            "that is not it (trailing ones are skipped)",
            self.pad_token_id,
        )

    def __call__(self, data: DataProto) -> torch.Tensor:
        return self.forward(self.encode(self.texts(self.chats(data))))


def default_max_length(config: Any) -> int:
    """``reward_model.max_length`` when null: the policy's longest sequence, prompt plus response (verl: the
    batch's width)."""
    return int(config.data.max_prompt_length + config.data.max_response_length)

"""The generative reward model's test helpers: a tiny judge made here, its config, and its HTTP client."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.config import load_config
from verl.models import make_tiny_model

CLIENT = (
    "async def judge(data_source, solution_str, ground_truth, extra_info=None, reward_router_address=None):\n"
)
CLIENT += "    return 0.0\n"


def make_judge(out: Path, **shape: int) -> Path:
    """A tiny causal LM whose greedy replies differ from prompt to prompt (the default initialisation's tiny
    weights answer every prompt with the same newline); ``shape``: more of make_tiny_model's sizes."""
    path = make_tiny_model(out / "init", hidden_size=64, num_hidden_layers=2, intermediate_size=128, **shape)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0, 0.3)
    model.save_pretrained(out / "judge")
    tokenizer.save_pretrained(out / "judge")
    return out / "judge"


def genrm_config(judge: Path, tmp: Path, *extra: str) -> Any:
    client = tmp / "client.py"
    client.write_text(CLIENT)
    overrides = ["reward_model.enable=true", f"reward_model.model.path={judge}"]
    overrides += [
        f"custom_reward_function.path={client}",
        "custom_reward_function.name=judge",
        "data.train_files=x",
    ]
    return load_config("grpo", [*overrides, *extra], check=False)


def post(address: str, path: str, body: Any) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://{address}{path}", data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def chat_ids(tokenizer: Any, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]

"""Rollout speed: tokens/s of the registered rollout engines ("hf" vs "fast") on tiny random models.

    python benchmarks/rollout_speed.py results.json [--batches 1,16,64,256] [--lengths 32,128]

Two random-weight Qwen2 decoders from ``verl.models.make_tiny_model``:

* ``tiny``: the default recipe's ``prepare.tiny_model`` (hidden 128, 4 layers, intermediate 512,
  4 heads, 2 kv heads; 1.0M parameters);
* ``4m``: hidden 256, 4 layers, intermediate 1024, 4 heads, 2 kv heads (4.0M parameters).

Main table: every run samples (temperature 1, no top-k / top-p: the default training settings) from
16-token prompts with 0-8 tokens of left padding, for exactly ``length`` new tokens: the EOS id given
to the engines is ``vocab_size``, an id no model can emit, so neither engine stops early and both do
the same work. tokens/s = batch * length / wall seconds of one ``generate_sequences`` call.

``--rl`` adds, per model, the batch of a GRPO step: 8 distinct prompts x 8 samples each (``rollout.n``),
64 rows, EOS on as in ``--eos-rows``, 32 and 128 new tokens at most.

``--decoders`` adds the fast engine with one choice of its lean decoder undone, each as its own column
(``onednn``: oneDNN's matmul over the module's weights instead of prepacked copies; ``torch``:
``F.linear``; ``hf-prefill``: the prompts through the HF forward instead of the lean ops; ``sdpa``: the decode
step's attention by torch's fused kernel over a cache in the compute dtype, instead of two float32 matmuls).

``--dtype bf16`` runs every engine under ``torch.autocast("cpu", bfloat16)``, as the trainer does on a CPU
with bf16 instructions (``fsdp_config.mixed_precision.param_dtype`` unset).

``--eos-rows`` adds, per model, a batch-64 run where generation does stop: the EOS set is enough
token ids that a random model (close to uniform over its vocabulary) stops with probability ~1/48
per token, so response lengths spread out as in RL and the engines differ in what they do with
finished rows. There tokens/s counts response tokens up to and including EOS.

Engines run alternately within each repetition (background load hits both alike); the best
repetition is reported, the median is in the JSON; each configuration gets one untimed warm-up
call. Standalone on purpose: it needs only the engine registry, so it can move into ``verl bench``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

MODELS = {
    "tiny": {"hidden_size": 128, "intermediate_size": 512},
    "4m": {"hidden_size": 256, "intermediate_size": 1024},
}
SHARED = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}
PROMPT_LEN = 16
STOP_EVERY = 48  # expected tokens between EOS in the --eos-rows runs


def make_prompts(batch: int, vocab_size: int, seed: int = 0, repeat: int = 1):
    """Left-padded random prompts: every row has 8-16 real tokens; each ``repeat`` times in a row (GRPO)."""
    from verl.protocol import DataProto

    if repeat > 1:
        return make_prompts(batch // repeat, vocab_size, seed).repeat(repeat, interleave=True)

    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, vocab_size, (batch, PROMPT_LEN), generator=gen)
    pads = torch.randint(0, 9, (batch,), generator=gen)
    attention_mask = (torch.arange(PROMPT_LEN)[None, :] >= pads[:, None]).long()
    input_ids = input_ids * attention_mask
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    return DataProto.from_dict(
        tensors={"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
    )


def load_model(name: str, workdir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    from verl.models import make_tiny_model

    path = make_tiny_model(workdir / name, seed=0, **MODELS[name], **SHARED)
    return AutoModelForCausalLM.from_pretrained(path).eval()


def run_case(engines: dict, prompts, length: int, reps: int) -> dict[str, dict]:
    """Time each engine ``reps`` times (alternating); returns best / median tokens/s per engine."""
    from verl.workers.rollout import SamplingParams

    sampling = SamplingParams(do_sample=True, temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=length)
    for engine in engines.values():
        engine.generate_sequences(prompts, SamplingParams(max_new_tokens=4))
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(reps):
        for name, engine in engines.items():
            start = time.perf_counter()
            out = engine.generate_sequences(prompts, sampling)
            seconds = time.perf_counter() - start
            rates[name].append(float(out.batch["response_mask"].sum()) / seconds)
    return {name: {"best": max(r), "median": statistics.median(r)} for name, r in rates.items()}


DECODERS = {  # --decoders: the fast engine with one of its lean decoder's choices undone
    "fast": {},
    "fast-onednn": {"matmul_override": "onednn"},
    "fast-torch": {"matmul_override": "torch"},
    "fast-hf-prefill": {"lean_prefill": False},
    "fast-sdpa": {"decode_attention": "sdpa"},
}


class _Ablation:
    """The fast engine with class settings of ``LeanWeights`` / ``_LeanDecoder`` changed during each call."""

    def __init__(self, engine, settings: dict) -> None:
        self.engine, self.settings = engine, settings

    def generate_sequences(self, prompts, sampling):
        from verl.workers.rollout.decoders import _LeanDecoder
        from verl.workers.rollout.lean_weights import LeanWeights

        owners = {name: LeanWeights if hasattr(LeanWeights, name) else _LeanDecoder for name in self.settings}
        saved = {name: getattr(owners[name], name) for name in self.settings}
        for name, value in self.settings.items():
            setattr(owners[name], name, value)
        try:
            return self.engine.generate_sequences(prompts, sampling)
        finally:
            for name, value in saved.items():
                setattr(owners[name], name, value)


def make_engines(model, eos: list[int], names: list[str], dtype: str) -> dict:
    """The named engines; under bf16 each runs under autocast (what ``RolloutEngine.compute_dtype`` does)."""
    from verl.workers.rollout import get_rollout_class

    engines = {}
    for name in names:
        engine = get_rollout_class("fast" if name in DECODERS else name)(model, eos, 0)
        engine.compute_dtype = torch.bfloat16 if dtype == "bf16" else None
        engines[name] = _Ablation(engine, DECODERS[name]) if DECODERS.get(name) else engine
    return engines


def bench_model(name: str, model, args) -> list[dict]:
    vocab = model.config.vocab_size
    n_params = sum(p.numel() for p in model.parameters())
    never = [vocab]  # no model emits this id: full-length responses
    stop_ids = list(range(3, 3 + max(1, round(vocab / STOP_EVERY))))
    eos_label = f"{len(stop_ids)} ids"
    cases = [(batch, length, never, "none", 1) for length in args.lengths for batch in args.batches]
    if args.eos_rows:
        cases.append((64, 128, stop_ids, eos_label, 1))
    if args.rl:
        cases += [(64, length, stop_ids, eos_label, 8) for length in (32, 128)]
    rows = []
    for batch, length, eos, eos_label, repeat in cases:
        engines = make_engines(model, eos, args.engines, args.dtype)
        reps = 1 if batch * length >= 256 * 128 else args.reps
        result = run_case(engines, make_prompts(batch, vocab, repeat=repeat), length, reps)
        row = {"model": name, "params": n_params, "batch": batch, "length": length, "eos": eos_label}
        row["prompts"] = batch // repeat
        row["reps"] = reps
        for e in args.engines:
            row[f"{e}_tok_s"] = result[e]["best"]
            row[f"{e}_tok_s_median"] = result[e]["median"]
        for e in args.engines:
            if e != "hf" and "hf" in args.engines:
                row[f"{e}_speedup"] = row[f"{e}_tok_s"] / row["hf_tok_s"]
        rows.append(row)
        print(format_row(row, args.engines), flush=True)
    return rows


def header(engines: list[str]) -> str:
    cells = [f"{'model':>5}", f"{'batch':>5}", f"{'prompts':>7}", f"{'len':>4}", f"{'eos':>6}"]
    cells += [f"{e + ' tok/s':>10}" for e in engines]
    cells += [f"{e + '/hf':>8}" for e in engines if e != "hf" and "hf" in engines]
    return " ".join(cells)


def format_row(row: dict, engines: list[str]) -> str:
    cells = [f"{row['model']:>5}", f"{row['batch']:>5}", f"{row['prompts']:>7}", f"{row['length']:>4}"]
    cells += [f"{row['eos']:>6}"]
    cells += [f"{row[f'{e}_tok_s']:>10.0f}" for e in engines]
    cells += [f"{row[f'{e}_speedup']:>7.2f}x" for e in engines if f"{e}_speedup" in row]
    return " ".join(cells)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="where to write the JSON results")
    parser.add_argument("--models", default="tiny,4m", type=lambda s: s.split(","))
    parser.add_argument("--engines", default="hf,fast", type=lambda s: s.split(","))
    parser.add_argument("--batches", default="1,16,64,256", type=lambda s: [int(b) for b in s.split(",")])
    parser.add_argument("--lengths", default="32,128", type=lambda s: [int(n) for n in s.split(",")])
    parser.add_argument("--reps", type=int, default=3, help="repetitions (1 for batch*length >= 256*128)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--eos-rows", action="store_true", help="add a run per model where EOS stops rows")
    parser.add_argument("--rl", action="store_true", help="add a GRPO step's batch: 8 prompts x 8, EOS on")
    parser.add_argument("--decoders", action="store_true", help="add the fast engine's ablations as columns")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="bf16: under CPU autocast")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.decoders:
        args.engines += [name for name in DECODERS if name not in args.engines]
    torch.set_num_threads(args.threads)
    rows = []
    print(header(args.engines))
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            rows += bench_model(name, load_model(name, Path(tmp)), args)
    result = {
        "torch": torch.__version__,
        "threads": args.threads,
        "dtype": args.dtype,
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "prompt_len": PROMPT_LEN,
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

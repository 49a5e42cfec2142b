"""Datasets, batching and built-in tasks: everything between a parquet file and a batch of prompts."""

from verl.data.io import BAD_ROW_POLICIES, BadRows, DatasetError, read_files, read_rows, write_rows
from verl.data.rl_dataset import RLDataset, collate_rl, normalize_messages, render_prompt, truncate_ids
from verl.data.sampler import EpochSampler, iterate_batches
from verl.data.sft_dataset import SFTDataset, collate_sft
from verl.data.tasks import TASKS, make_arithmetic_rows, write_arithmetic_dataset

__all__ = [
    "BAD_ROW_POLICIES",
    "TASKS",
    "BadRows",
    "DatasetError",
    "EpochSampler",
    "RLDataset",
    "SFTDataset",
    "collate_rl",
    "collate_sft",
    "iterate_batches",
    "make_arithmetic_rows",
    "normalize_messages",
    "read_files",
    "read_rows",
    "render_prompt",
    "truncate_ids",
    "write_arithmetic_dataset",
    "write_rows",
]

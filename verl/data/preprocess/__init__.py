"""Turn local copies of hub math datasets (GSM8K, MATH) into verl's train/test parquet files, or generate
reasoning-gym tasks into them.

The rows match what verl's ``examples/data_preprocess/gsm8k.py`` and ``math_dataset.py`` write, column for
column and instruction for instruction, so data prepared here or there trains and scores the same. Run
``python -m verl.data.preprocess {gsm8k,math} --local_dataset_path PATH --local_save_dir DIR``, or call
:func:`main` with those arguments, or :func:`preprocess` for the rows written. ``python -m
verl.data.preprocess reasoning_gym --task gsm_symbolic --size N --seed S`` (or
:func:`preprocess_reasoning_gym`) generates a reasoning-gym task's rows instead.
"""

from verl.data.preprocess.cli import main
from verl.data.preprocess.pipeline import DATASETS, WrittenSplit, preprocess
from verl.data.preprocess.reasoning_gym import GeneratedSplits, generate_splits, preprocess_reasoning_gym
from verl.data.preprocess.spec import DatasetSpec

__all__ = [
    "DATASETS",
    "DatasetSpec",
    "GeneratedSplits",
    "WrittenSplit",
    "generate_splits",
    "main",
    "preprocess",
    "preprocess_reasoning_gym",
]

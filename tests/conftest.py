"""Shared fixtures: a tiny model and the arithmetic task, built once per test session."""

from __future__ import annotations

import os
from contextlib import contextmanager

import pytest

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, the longest work first: the modules marked xdist_group (the two-node cluster, the
    bench), then the slow tests, in collection order otherwise. With --dist loadfile xdist still reorders the
    modules by their number of tests unless --no-loadscope-reorder is given (not yet in the test command)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(
            key=lambda item: (
                0 if item.get_closest_marker("xdist_group") else 1 if item.get_closest_marker("slow") else 2
            )
        )


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from verl.models import make_tiny_model

    return make_tiny_model(
        tmp_path_factory.mktemp("tiny-model"), hidden_size=64, num_hidden_layers=2, intermediate_size=128
    )


@pytest.fixture(scope="session")
def arithmetic_files(tmp_path_factory):
    from verl.data import write_arithmetic_dataset

    return write_arithmetic_dataset(
        tmp_path_factory.mktemp("arithmetic"), max_operand=9, holdout_frac=0.2, seed=0
    )


@contextmanager
def torch_threads(count: int):
    """torch's intra-op thread count set to ``count`` for the block, then put back."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def one_torch_thread():
    """Models this small gain nothing from a second thread, and stall on a busy machine with two."""
    with torch_threads(1):
        yield


@pytest.fixture
def two_torch_threads():
    """Two intra-op threads, whatever the machine's default (tests of how threads share them)."""
    with torch_threads(2):
        yield

"""Test-session setup.

Without a GPU the Triton kernels run in Triton's interpreter: ``TRITON_INTERPRET=1`` must be set
before any kernel module is imported (``@triton.jit`` reads it when it decorates), so it is set here.
Tests marked ``gpu`` are skipped without CUDA and reported as skipped, never as passed.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def device() -> torch.device:
    """Where kernel tests run: the GPU when there is one, else the CPU through the interpreter."""
    return torch.device("cuda" if HAS_CUDA else "cpu")

"""Test-session setup.

Without a GPU the Triton kernels run in Triton's interpreter: ``TRITON_INTERPRET=1`` must be set
before any kernel module is imported (``@triton.jit`` reads it when it decorates), so it is set here.
Tests marked ``gpu`` are skipped without CUDA and reported as skipped, never as passed.  Tests that take the
``device`` fixture are marked ``kernel``: in the interpreter here, natively on a GPU machine, where the GPU suite is
``python -m pytest tests -m "gpu or kernel"``.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Tests that take the ``device`` fixture run their kernels natively where CUDA is: marked ``kernel`` so that the
    # GPU suite selects them with the ``gpu`` ones (``-m "gpu or kernel"``).  Until session 49 it ran ``-m gpu``
    # alone and none of them ran on a GPU; the first that did (the dense-row kernels' files, H100) found the gated
    # product's sign of zero unlike CUDA's torch.relu in 9 bit tests.
    kernel = pytest.mark.kernel
    for item in items:
        if "device" in getattr(item, "fixturenames", ()):
            item.add_marker(kernel)
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

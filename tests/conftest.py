import os

import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        # a no_gpu test reaches the launch with CPU pointers: on a GPU that is an illegal address, and every later
        # test of the process fails with it (session 47, a `-k` run on the H200)
        skip_no_gpu = pytest.mark.skip(reason="launches with CPU pointers: a check for machines without a GPU")
        for item in items:
            if "no_gpu" in item.keywords:
                item.add_marker(skip_no_gpu)
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def gen():
    """A seeded generator: fresh random data per test, reproducible across runs."""
    return torch.Generator().manual_seed(1234)


@pytest.fixture(autouse=True)
def poison_gpu_outputs(request):
    """Every GPU test, in every file: everything allocated during the test (by the library or the test) is NaN until
    written, cached workspaces too (tests/gpu_checks.py) — a region a kernel fails to write can never pass as a previous
    call's leftovers."""
    if request.node.get_closest_marker("gpu") is None:
        yield
        return
    from gpu_checks import poisoned_outputs
    with poisoned_outputs():
        yield


@pytest.fixture(autouse=True)
def fresh_call_plans():
    """Every test starts and ends with no call plan (``dsv4lib.ops.launch``): a plan fixes the tuning constants and
    configs it was made with, so one test's monkeypatches never reach another test through a plan."""
    from dsv4lib.ops import launch
    launch.forget_plans()
    yield
    launch.forget_plans()

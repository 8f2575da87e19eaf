"""GPU tests: the CUDA engine against the reference engine, through the same HybridEPBuffer.

Every test is marked ``gpu`` and skips without a CUDA GPU or without the CUDA engine. Ranks are
worker processes (tests/_pool.py); the tests are reordered so that each (world size,
placement) pool starts once, and the timeout test (which leaves its buffer unusable) runs last.
"""

from __future__ import annotations

import os
import sys

import pytest

_GPU_DIR = os.path.dirname(os.path.abspath(__file__))
_TESTS_DIR = os.path.dirname(_GPU_DIR)
for _path in (_TESTS_DIR, _GPU_DIR):  # the workers import gpu_cases and cases from here
    if _path not in sys.path:
        sys.path.insert(0, _path)

import gpu_env
from gpu_pool import GpuPools

_PLACEMENT_ORDER = {name: i for i, name in enumerate(gpu_env.PLACEMENTS)}


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu_last: run after every other GPU test (own pool)")


def pytest_report_header(config):
    if not gpu_env.AVAILABLE:
        return f"hybrid-ep GPU tests: skipped ({gpu_env.SKIP_REASON})"
    mode = "DRY RUN on the CPU" if gpu_env.DRY_RUN else f"{gpu_env.GPU_COUNT} GPU(s)"
    mps = "MPS control pipe found" if gpu_env.mps_running() else \
        "no MPS daemon found: ranks sharing a GPU will run slowly"
    return f"hybrid-ep GPU tests: {mode}; {mps}"


def _in_gpu_dir(item) -> bool:
    return str(item.path).startswith(_GPU_DIR + os.sep)


def _order(item):
    params = getattr(getattr(item, "callspec", None), "params", {})
    last = item.get_closest_marker("gpu_last") is not None
    return (last, _PLACEMENT_ORDER.get(params.get("placement"), 0), params.get("W", 0))


def pytest_collection_modifyitems(session, config, items):
    """Group the GPU tests by pool (stable: file order inside a group); others keep their
    places."""
    slots = [i for i, item in enumerate(items) if _in_gpu_dir(item)]
    ordered = sorted((items[i] for i in slots), key=_order)
    for slot, item in zip(slots, ordered, strict=True):
        items[slot] = item


@pytest.fixture(scope="session")
def gpu_pools():
    pools = GpuPools()
    yield pools
    pools.close()

"""Shared fixtures of the CPU suite.

Multi-rank tests run as jobs on a session-wide pool of worker processes per world size
(``_pool.py``); the code a rank runs lives in the importable package ``cases`` beside this
file, so this directory must be on ``sys.path`` (here, and through multiprocessing's spawn
preparation data, in every worker).
"""

from __future__ import annotations

import os
import sys

import pytest

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from _pool import PoolManager


@pytest.fixture(scope="session")
def pools():
    manager = PoolManager()
    yield manager
    manager.close()

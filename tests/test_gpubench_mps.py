"""The GPU bench runs ranks that share a GPU under MPS: a running daemon, else a private one it
starts and stops (gpubench/mps.py); without, the tables say the numbers are not valid. Checked
with a stand-in nvidia-cuda-mps-control on PATH."""

from __future__ import annotations

import os

import pytest

from hybrid_ep_bench.gpubench import mps

FAKE = """#!/bin/sh
# A stand-in for nvidia-cuda-mps-control: -d makes the control pipe, "quit" removes it.
if [ "$1" = "-d" ]; then
  [ -n "$FAIL" ] && { echo "An instance of this daemon is already running" >&2; exit 1; }
  touch "$CUDA_MPS_PIPE_DIRECTORY/control"; exit 0
fi
read cmd; [ "$cmd" = quit ] && rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
echo "$cmd" >> "$LOG"
"""


@pytest.fixture
def fake_tool(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-cuda-mps-control"
    tool.write_text(FAKE)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("LOG", str(tmp_path / "log"))
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "no-daemon-here"))
    return tmp_path


def test_not_needed_and_off():
    with mps.mps_for_ranks(False) as state:
        assert mps.valid(state) and state.startswith("not needed")
    with mps.mps_for_ranks(True, enabled=False) as state:
        assert not mps.valid(state) and "--no-mps" in state


def test_private_daemon_started_for_the_ranks_and_stopped(fake_tool):
    before = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
    with mps.mps_for_ranks(True) as state:
        assert state == mps.STARTED
        pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
        assert pipe != before and os.path.exists(os.path.join(pipe, "control"))
        assert os.environ["CUDA_MPS_LOG_DIRECTORY"]
    assert os.environ["CUDA_MPS_PIPE_DIRECTORY"] == before
    assert not os.path.exists(pipe)  # the daemon was told to quit and its folders removed
    assert (fake_tool / "log").read_text().split() == ["quit"]


def test_a_running_daemon_is_used(fake_tool, monkeypatch):
    pipe = fake_tool / "running"
    pipe.mkdir()
    (pipe / "control").touch()
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipe))
    with mps.mps_for_ranks(True) as state:
        assert state == mps.RUNNING and os.environ["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert (pipe / "control").exists()  # not ours to stop


def test_a_daemon_that_cannot_start_is_said(fake_tool, monkeypatch):
    monkeypatch.setenv("FAIL", "1")
    with mps.mps_for_ranks(True) as state:
        assert not mps.valid(state) and "already running" in state


def test_no_tool(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "none"))
    with mps.mps_for_ranks(True) as state:
        assert not mps.valid(state) and "not found" in state

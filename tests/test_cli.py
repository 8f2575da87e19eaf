"""The command line: ``python -m hybrid_ep bench`` (and the ``hybrid-ep`` console script) runs
the reference engine over gloo at 2 ranks, verifies the results and exits 0."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys

import pytest

SMALL = ["--ranks", "2", "--hidden", "256", "--tokens", "16", "--experts-per-rank", "2",
         "--topk", "2", "--iters", "2"]


def _run(cmd, tmp_path):
    proc = subprocess.run(cmd, cwd=tmp_path, env=dict(os.environ), capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, (f"{' '.join(cmd)} exited {proc.returncode}\n"
                                  f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc


@pytest.mark.parametrize("nodes", [1, 2])
def test_bench_two_ranks(tmp_path, nodes):
    out = tmp_path / "bench.json"
    _run([sys.executable, "-m", "hybrid_ep", "bench", *SMALL, "--nodes", str(nodes),
          "--json", str(out)], tmp_path)
    result = json.loads(out.read_text())
    assert result["config"]["ranks"] == 2 and result["config"]["nodes"] == nodes
    assert result["rows"], result


def _installed() -> bool:
    try:
        importlib.metadata.distribution("hybrid-ep")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _installed(), reason="the package is not installed (no console script)")
def test_console_script_bench(tmp_path):
    script = shutil.which("hybrid-ep")
    assert script, "hybrid-ep is installed but its console script is not on PATH"
    _run([script, "bench", *SMALL], tmp_path)

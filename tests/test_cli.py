"""The command line: ``python -m hybrid_ep bench`` (and the ``hybrid-ep`` console script) runs
the benchmark package (hybrid_ep_bench) on the reference engine over gloo at 2 ranks, verifies
the results and exits 0; without that package it says how to install it."""

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


def _fails(cmd, tmp_path, *expect):
    proc = subprocess.run(cmd, cwd=tmp_path, env=dict(os.environ), capture_output=True,
                          text=True, timeout=300, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"{' '.join(cmd)} exited 0:\n{text[-3000:]}"
    assert "Traceback" not in text, text[-3000:]
    for word in expect:
        assert word in text, f"{word!r} not in:\n{text[-3000:]}"
    return text


@pytest.mark.parametrize("flag,value", [("--warmup", "-1"), ("--iters", "0"), ("--ranks", "x"),
                                        ("--tokens", "-5")])
def test_bench_rejects_bad_counts_without_a_traceback(tmp_path, flag, value):
    _fails([sys.executable, "-m", "hybrid_ep", "bench", flag, value], tmp_path, flag)


def test_bench_json_path_is_checked_before_the_run(tmp_path):
    import time

    start = time.monotonic()
    _fails([sys.executable, "-m", "hybrid_ep", "bench", *SMALL, "--json",
            str(tmp_path / "missing" / "out.json")], tmp_path, "--json", "missing")
    assert time.monotonic() - start < 60


def test_bench_without_the_bench_package_names_its_install_command(tmp_path):
    hidden = ("import sys; sys.modules['hybrid_ep_bench'] = None; from hybrid_ep.cli import main; "
              "sys.exit(main(['bench', '--ranks', '2']))")
    _fails([sys.executable, "-c", hidden], tmp_path, "hybrid-ep-bench is not installed",
           "pip install --no-build-isolation ./benchmarks")


def test_the_product_holds_no_bench_code():
    """The measurement code lives in hybrid_ep_bench: neither the Python package nor its
    compiled core carries it."""
    import hybrid_ep
    from hybrid_ep import native

    package = os.path.dirname(hybrid_ep.__file__)
    for name in ("bench.py", "oracle.py", "gpubench"):
        assert not os.path.exists(os.path.join(package, name)), name
    core = native.load()
    if not isinstance(core, ImportError):
        for name in ("copy_ceiling", "start_gate", "gpu_time_ns"):
            assert not hasattr(core, name), name


def test_info_shows_values_in_effect_and_flags_malformed_ones(tmp_path):
    env = dict(os.environ, NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API="128", HYBRID_EP_TIMEOUT_S="abc",
               HYBRID_EP_COMBINE_PIECES="3")
    proc = subprocess.run([sys.executable, "-m", "hybrid_ep", "info"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert any("NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API = 128 (set)" in ln for ln in lines)
    assert any("NUM_OF_TOKENS_PER_CHUNK_COMBINE_API = 64 (default)" in ln for ln in lines)
    for name in ("HYBRID_EP_TIMEOUT_S", "HYBRID_EP_COMBINE_PIECES"):
        assert any(ln.strip().startswith(name) and "MALFORMED" in ln for ln in lines), \
            proc.stdout
    assert "2 malformed" in proc.stdout

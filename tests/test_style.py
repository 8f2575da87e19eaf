"""Style is part of the suite: ruff's rules for Python, .clang-format for C++/CUDA."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CPP_SUFFIXES = {".cu", ".cuh", ".h", ".cpp"}


def test_python_passes_ruff():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", str(ROOT)], check=False,
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_cpp_matches_clang_format():
    tool = shutil.which("clang-format")
    assert tool, "clang-format is missing: install the test extras (bash tools/setup.sh --test)"
    files = [str(p) for folder in ("csrc", "backends") for p in (ROOT / folder).rglob("*")
             if p.suffix in CPP_SUFFIXES]
    result = subprocess.run([tool, "--dry-run", "--Werror", *files], check=False,
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-4000:]

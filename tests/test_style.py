"""Style is part of the suite: ruff's rules for Python, .clang-format for C++/CUDA."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CPP_SUFFIXES = {".cu", ".cuh", ".h", ".cpp"}
# The core, its backends and the benchmark package's kernels.
CPP_FOLDERS = ("csrc", "backends", "benchmarks/csrc")


def test_python_passes_ruff():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", str(ROOT)], check=False,
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_cpp_matches_clang_format():
    tool = shutil.which("clang-format")
    assert tool, "clang-format is missing: install the test extras (bash tools/setup.sh --test)"
    files = [str(p) for folder in CPP_FOLDERS for p in (ROOT / folder).rglob("*")
             if p.suffix in CPP_SUFFIXES]
    result = subprocess.run([tool, "--dry-run", "--Werror", *files], check=False,
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-4000:]


def test_device_functions_in_headers_are_inline_or_templates():
    """A header's non-inline __device__ function is one symbol per translation unit that
    includes it: a duplicate-symbol error once device code links relocatably (the nvshmem
    build's -rdc)."""
    import re

    pattern = re.compile(r"^(template\s*<[^\n]*>\s*\n)?(__device__[^\n(]*\()", re.MULTILINE)
    offenders = []
    for folder in CPP_FOLDERS:
        for path in (ROOT / folder).rglob("*"):
            if path.suffix not in (".cuh", ".h"):
                continue
            for match in pattern.finditer(path.read_text()):
                if match.group(1) is None and "inline" not in match.group(2):
                    offenders.append(f"{path.relative_to(ROOT)}: {match.group(2)}")
    assert not offenders, "\n".join(offenders)

"""The layers of docs/architecture.md: a C++ file includes only its own layer and the ones
before it (common, memory, transport, kernels, runtime, executor, bindings), and a backend only
common, memory and transport."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["common", "memory", "transport", "kernels", "runtime", "executor", "bindings"]
BACKEND_MAY_USE = {"common", "memory", "transport"}
INCLUDE = re.compile(r'#include "hybrid_ep/(\w+)/')


def _sources(folder: Path):
    return (p for p in sorted(folder.rglob("*")) if p.suffix in (".h", ".cuh", ".cu", ".cpp"))


def test_core_layers_include_only_themselves_and_the_layers_before():
    wrong = []
    for path in _sources(ROOT / "csrc" / "hybrid_ep"):
        layer = path.relative_to(ROOT / "csrc" / "hybrid_ep").parts[0]
        assert layer in LAYERS, f"{path}: folder {layer!r} is not a layer of docs/architecture.md"
        allowed = set(LAYERS[: LAYERS.index(layer) + 1])
        wrong += [f"{path}: {dep}" for dep in INCLUDE.findall(path.read_text())
                  if dep not in allowed]
    assert not wrong, wrong


def test_backends_include_only_common_memory_and_transport():
    wrong = [f"{path}: {dep}" for path in _sources(ROOT / "backends")
             for dep in INCLUDE.findall(path.read_text()) if dep not in BACKEND_MAY_USE]
    assert not wrong, wrong

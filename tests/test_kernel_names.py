"""The bench finds each operation's kernel time by a substring of the kernel's name in the
profile (hybrid_ep_bench.gpubench: OPS, PAIRED_KERNELS, PREPROCESS_KERNELS). Each of those
substrings must name exactly one kernel of the core: a second one (session 17's
publish_dispatch_kernel) silently halved the dispatch's kernel column."""

from __future__ import annotations

import re
from pathlib import Path

from hybrid_ep_bench.gpubench.config import OPS, PAIRED_KERNELS, PREPROCESS_KERNELS

ROOT = Path(__file__).resolve().parent.parent
_GLOBAL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)")


def _kernels() -> set[str]:
    names = set()
    for path in (ROOT / "csrc").rglob("*.cu*"):
        names.update(_GLOBAL.findall(path.read_text()))
    return names


def test_every_profile_filter_names_one_kernel():
    kernels = _kernels()
    filters = {op[1] for op in OPS.values()} | set(PAIRED_KERNELS.values()) | set(
        PREPROCESS_KERNELS)
    assert "dispatch_kernel" in filters and "combine_kernel" in filters
    for wanted in sorted(filters):
        matches = sorted(k for k in kernels if wanted in k
                         # the bench leaves unpermute out of permute_kernel's matches
                         and not (wanted == "permute_kernel" and "unpermute" in k))
        assert matches == [wanted], f"profile filter {wanted!r} matches kernels {matches}"

"""How the CUDA engine sizes the fused permute/unpermute blocks (host-side arithmetic only)."""

from __future__ import annotations

import pytest

from hybrid_ep.cuda_engine import MIN_DEFAULT_FUSED_BLOCKS, fused_blocks


@pytest.mark.parametrize(
    ("requested", "sms", "kernel_sms", "ranks_on_gpu", "mps_share", "expected"),
    [
        (None, 132, 8, 1, False, 124),  # one rank: every SM the kernel leaves
        (None, 132, 16, 2, False, 50),  # two ranks split the GPU: 66 each, less 16
        (None, 132, 8, 8, False, MIN_DEFAULT_FUSED_BLOCKS),  # 16 - 8 is below the floor
        (None, 66, 8, 2, True, 58),  # an MPS share is this rank's part already
        (40, 132, 8, 1, False, 40),  # asked for: taken as is
        (200, 132, 8, 1, False, 124),  # asked for more than fit: clamped
        (None, 132, 132, 1, False, 0),  # nothing left: the caller raises
    ],
)
def test_fused_blocks(requested, sms, kernel_sms, ranks_on_gpu, mps_share, expected):
    assert fused_blocks(requested, sms, kernel_sms, ranks_on_gpu, mps_share) == expected

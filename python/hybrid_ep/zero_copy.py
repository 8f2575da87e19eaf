"""Zero-copy dispatch outputs and combine inputs (docs/zero-copy.md).

Inside one NVLink domain the CUDA engine's registered buffer holds a pool; a dispatch's outputs
are carved out of one pool block, so every rank's stores land in them directly and nothing is
copied out. The block comes back as ordinary torch tensors (DLPack, whose deleters return the
block): the rows, probs and scales, and the block lives as long as any of them.
A combine whose input rows (and probs) lie in the pool is read there by the peers, so nothing
is staged. When the pool cannot serve a call, the call copies as before: counted here, and
warned about once per buffer.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields

import torch

# The pool's size when HYBRID_EP_ZERO_COPY_POOL_MB is unset: this many receive regions'
# worth of dispatch outputs (rows, probs, scales at the buffer's receive cap), so that a step
# that keeps a few calls' outputs alive at once (forward and backward of a layer) is served.
DEFAULT_POOL_OUTPUTS = 4
# Where the pieces of one block start: a multiple of the pool's own block alignment.
_ALIGN = 512
_CUDA = torch.cuda.is_available()
# torch.from_dlpack's own work, without its wrapper's checks for other producers (a capsule is
# all this module hands it).
_from_dlpack = getattr(torch._C, "_from_dlpack", torch.from_dlpack)


@dataclass
class CopyStats:
    """What ``HybridEPBuffer.copy_stats`` reports (all counts since the buffer was built)."""

    dispatch_zero_copy: int = 0  # dispatches whose outputs the peers wrote in place
    dispatch_copied: int = 0  # dispatches copied out of the registered buffer
    dispatch_bytes_copied: int = 0
    combine_zero_copy: int = 0  # combines whose input rows the peers read in place
    combine_staged: int = 0  # combines that staged (copied) input into the registered buffer
    combine_bytes_staged: int = 0
    pool_fallbacks: int = 0  # calls that wanted the pool but found no room (then copied)
    # Several domains, a backend whose puts read only registered memory: dispatches that copied
    # their rows (and FP8 scales) into the registered buffer for the network, and the bytes.
    network_staged: int = 0
    network_bytes_staged: int = 0

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def pool_bytes(enabled: bool, nodes: int, pool_mb: int | None, received_rows: int,
               hidden_dim: int, experts_per_rank: int, ranks_per_domain: int) -> int:
    """Bytes of the zero-copy pool a buffer of this config registers: none with zero-copy off;
    HYBRID_EP_ZERO_COPY_POOL_MB when set; else, inside one domain, DEFAULT_POOL_OUTPUTS times
    one dispatch's outputs at the receive cap (BF16 rows, probs and FP8 scales), and none with
    several domains (whose dispatch outputs are not in the pool: there it only holds inputs the
    network's puts read in place, a pool the user asks for)."""
    if not enabled:
        return 0
    if pool_mb is not None:
        return pool_mb << 20
    if nodes > 1:
        return 0
    per_row = 2 * hidden_dim + 4 * experts_per_rank * ranks_per_domain + 4 * (hidden_dim // 128)
    return DEFAULT_POOL_OUTPUTS * (received_rows * per_row + 3 * _ALIGN)


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class ZeroCopyPool:
    """The engine's side of the pool: carves outputs, keeps the counts, warns once."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.stats = CopyStats()
        self._warned = False
        self._pool_bytes = 0  # of the runtime attached last

    def attach(self, runtime) -> None:
        """The engine's (new) runtime, whose pool the next calls use."""
        self._pool_bytes = int(runtime.pool_stats()["bytes"])

    def usable(self, runtime) -> bool:
        """Whether calls may use the pool now: not while a CUDA graph is captured (a replay
        would write into blocks freed since)."""
        if not self.enabled or self._pool_bytes == 0:
            return False
        return not (_CUDA and torch.cuda.is_current_stream_capturing())

    def dispatch_outputs(self, runtime, device: torch.device, rows: int, cols: int,
                         dtype: torch.dtype, prob_cols: int | None, scale_cols: int | None):
        """(rows, probs, scales) tensors in one pool block, or None when the pool cannot hold
        them (counted, warned once)."""
        row_bytes = cols * dtype.itemsize
        bf16 = dtype == torch.bfloat16
        # The runtime builds the three tensors' capsules (one block, shared): views made here
        # cost ~10 us more of every call.
        capsules = runtime.pool_outputs(rows, row_bytes, bf16, prob_cols or 0, scale_cols or 0,
                                        device.index)
        if capsules is None:
            self.fell_back(runtime, sum(_aligned(rows * b) for b in
                                        (row_bytes, 4 * (prob_cols or 0), 4 * (scale_cols or 0))))
            return None
        out = _from_dlpack(capsules[0])
        if not bf16:
            out = out.view(dtype)
        probs = _from_dlpack(capsules[1]) if prob_cols else None
        scales = _from_dlpack(capsules[2]) if scale_cols else None
        self.stats.dispatch_zero_copy += 1
        return out, probs, scales

    def empty(self, runtime, device: torch.device, shape: tuple, dtype: torch.dtype):
        """A tensor in the pool, or None when the pool cannot hold it (counted, warned once)."""
        numel = 1
        for n in shape:
            numel *= n
        size = numel * dtype.itemsize
        if not self.usable(runtime):
            return None
        capsule = runtime.pool_block(size, device.index)
        if capsule is None:
            self.fell_back(runtime, size)
            return None
        return _from_dlpack(capsule).view(dtype).view(shape)

    def fell_back(self, runtime, wanted: int) -> None:
        self.stats.pool_fallbacks += 1
        if self._warned:
            return
        self._warned = True
        s = runtime.pool_stats()
        warnings.warn(
            f"HybridEPBuffer: the zero-copy pool ({s['bytes'] / 2**20:.0f} MiB, "
            f"{s['in_use'] / 2**20:.0f} MiB held by {s['blocks']} live tensors) has no room "
            f"for {wanted / 2**20:.1f} MiB; this call and later ones like it copy instead "
            "(copy_stats()['pool_fallbacks'] counts them). Free earlier outputs sooner or raise "
            "HYBRID_EP_ZERO_COPY_POOL_MB. Warned once per buffer.", RuntimeWarning, stacklevel=5)

    def copied_dispatch(self, bytes_copied: int) -> None:
        self.stats.dispatch_copied += 1
        self.stats.dispatch_bytes_copied += bytes_copied

    def network_sent(self, staged_bytes: int) -> None:
        """A dispatch whose network sources were staged (``staged_bytes`` > 0) or not."""
        if staged_bytes:
            self.stats.network_staged += 1
            self.stats.network_bytes_staged += staged_bytes

    def combined(self, staged_bytes: int) -> None:
        """A plain combine with rows, which staged ``staged_bytes`` (0: read in place)."""
        if staged_bytes == 0:
            self.stats.combine_zero_copy += 1
        else:
            self.stats.combine_staged += 1
            self.stats.combine_bytes_staged += staged_bytes

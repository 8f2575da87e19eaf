"""The fingerprint of a call that every rank must agree on before data moves.

A collective call is only meaningful when every rank makes the same one: the same operation on
the same engine, rows of the same dtype and width, the same optional tensors, the same handle.
Ranks exchange a ``CallStamp`` in the first exchange the call makes anyway (the reference
engine's rendezvous, the CUDA engine's routing all-gather and barriers) and raise
``HybridEPMismatchError`` naming the ranks and the difference when they disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

OPS = ("dispatch", "dispatch_with_permute", "combine", "combine_with_unpermute",
       "get_combine_input_buffer")
_WIDTH_BITS = 20
_HANDLE_BITS = 32


@dataclass(frozen=True)
class CallStamp:
    op: str
    engine: str = "reference"  # or "cuda"
    fp8: bool = False
    width: int = 0  # columns of hidden (0: no hidden, e.g. get_combine_input_buffer's own)
    probs: bool = False
    scales: bool = False
    handle: int = 0  # id of the handle passed (0: none); ids count the buffer's handles
    non_blocking: bool = False
    fused: bool = False

    def with_handle(self, config) -> CallStamp:
        """The stamp of a call that passes the handle whose config is ``config``."""
        # Positional, in field order: dataclasses.replace costs ~2 us more, on every call.
        return CallStamp(self.op, self.engine, self.fp8, self.width, self.probs, self.scales,
                         config.handle_id or 0, self.non_blocking, self.fused)

    def pack(self) -> int:
        """A nonzero int below 2**63 (the GPU compares these as uint64 words)."""
        if self.op not in OPS:
            raise ValueError(f"internal: unknown op {self.op!r}")
        value = OPS.index(self.op) + 1
        flags = (self.engine == "cuda", self.fp8, self.probs, self.scales, self.non_blocking,
                 self.fused)
        for bit, flag in enumerate(flags, start=3):
            value |= int(bool(flag)) << bit
        value |= (self.width % (1 << _WIDTH_BITS)) << 9
        value |= (self.handle % (1 << _HANDLE_BITS)) << (9 + _WIDTH_BITS)
        return value

    @staticmethod
    def unpack(value: int) -> CallStamp:
        op = value & 7
        flags = [bool(value >> bit & 1) for bit in range(3, 9)]
        return CallStamp(op=OPS[op - 1] if 1 <= op <= len(OPS) else f"op {op}",
                         engine="cuda" if flags[0] else "reference", fp8=flags[1],
                         probs=flags[2], scales=flags[3], non_blocking=flags[4], fused=flags[5],
                         width=value >> 9 & ((1 << _WIDTH_BITS) - 1),
                         handle=value >> (9 + _WIDTH_BITS) & ((1 << _HANDLE_BITS) - 1))

    def describe(self) -> str:
        parts = [self.op, f"{self.engine} engine",
                 f"{'FP8' if self.fp8 else 'BF16'} hidden of {self.width} columns",
                 "probs" if self.probs else "no probs"]
        if self.scales:
            parts.append("scaling factors")
        parts.append(f"handle #{self.handle}" if self.handle else "no handle")
        if self.non_blocking:
            parts.append("non_blocking")
        if self.fused:
            parts.append("fused")
        return ", ".join(parts)


def differences(a: CallStamp, b: CallStamp) -> list[str]:
    """The fields in which ``b`` differs from ``a``, as ``name a -> b``."""
    return [f"{f.name} {getattr(a, f.name)!r} vs {getattr(b, f.name)!r}" for f in fields(a)
            if getattr(a, f.name) != getattr(b, f.name)]


def mismatch_message(me: int, stamps: dict[int, CallStamp]) -> str | None:
    """None when every rank's stamp equals this rank's; else what differs, rank by rank."""
    mine = stamps[me]
    other = {r: s for r, s in stamps.items() if s != mine}
    if not other:
        return None
    head = (f"rank {me}: ranks disagree on the call (every rank must make the same call); this "
            f"rank: {mine.describe()}")
    lines = [head]
    for r in sorted(other):
        what = "; ".join(differences(mine, other[r]))
        lines.append(f"rank {r}: {other[r].describe()} ({what})")
    return "\n  ".join(lines)

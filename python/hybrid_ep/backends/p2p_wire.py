"""The p2p build's emulated network (``HYBRID_EP_P2P_WIRE``): its settings, the transport
options that carry them to the backend (backends/p2p/wire_model.h), and the time a NIC of those
settings needs at least for a given traffic, which the bench reports against and the scaling
model builds on.

An emulation, not a network: puts between domains still land at once over CUDA IPC; each put
or signal occupies its channel's rail for ``op_ns`` + bytes / rate, and a signal is released to
the receiver only ``latency_us`` after its rail has carried it and every put before it; with
``atomic_rtt=1`` (the default), as on a multi-path NIC that fences an atomic after writes, one
round trip (2 x latency) later still. An eager put's tiles (HYBRID_EP_EAGER) carry no atomic:
each becomes visible when the rail has carried it, plus the latency.
"""

from __future__ import annotations

from dataclasses import dataclass

VARIABLE = "HYBRID_EP_P2P_WIRE"
DEFAULTS = {"gbps": 50.0, "latency_us": 3.0, "op_ns": 400.0, "rails": 1, "atomic_rtt": 1}
DEFAULT_TEXT = "gbps=50,latency_us=3,op_ns=400,rails=1,atomic_rtt=1"
_INTEGERS = ("rails", "atomic_rtt")
MAX_RAILS = 64


@dataclass(frozen=True)
class WireSpec:
    gbps: float = 50.0  # GB/s (1e9 bytes per second) of one rail
    latency_us: float = 3.0
    op_ns: float = 400.0  # a rail's cost per operation (put or signal), before its bytes
    rails: int = 1  # channel c leaves through rail c % rails
    atomic_rtt: int = 1  # 1: a signal after puts waits one more round trip (the NIC's fence)

    def text(self) -> str:
        return (f"gbps={self.gbps:g},latency_us={self.latency_us:g},op_ns={self.op_ns:g},"
                f"rails={self.rails},atomic_rtt={self.atomic_rtt}")

    def transport_options(self) -> dict[str, str]:
        """The p2p backend's options (integers: femtoseconds per byte, nanoseconds)."""
        return {"wire_fs_per_byte": str(max(1, round(1e6 / self.gbps))),
                "wire_op_ns": str(round(self.op_ns)),
                "wire_latency_ns": str(round(self.latency_us * 1e3)),
                "wire_rails": str(self.rails),
                "wire_fence_ns": str(round(2 * self.latency_us * 1e3) if self.atomic_rtt else 0)}

    def lower_bound_s(self, bytes_sent: float, operations: float, rails_used: int | None = None
                      ) -> float:
        """The least time a rank's sends take through this NIC: its bytes and operations
        spread evenly over the rails it uses, then one latency."""
        rails = min(self.rails, rails_used or self.rails)
        return ((bytes_sent / (self.gbps * 1e9) + operations * self.op_ns * 1e-9) / rails
                + self.latency_us * 1e-6)


def parse(text: str | None, variable: str = VARIABLE) -> WireSpec | None:
    """``"gbps=50,latency_us=3,op_ns=400,rails=1,atomic_rtt=1"`` (any subset; the rest
    default), or None for unset, empty or ``off``. Raises ValueError naming the variable."""
    if text is None or text.strip() in ("", "off", "0"):
        return None
    values: dict[str, float | int] = dict(DEFAULTS)
    for entry in text.split(","):
        key, sep, raw = entry.strip().partition("=")
        if not sep or key not in DEFAULTS:
            raise ValueError(f"environment variable {variable}={text!r}: entry {entry!r} is "
                             f"not one of {', '.join(k + '=...' for k in DEFAULTS)}")
        try:
            value = int(raw) if key in _INTEGERS else float(raw)
        except ValueError:
            raise ValueError(f"environment variable {variable}={text!r}: {key}={raw!r} is not "
                             f"{'an integer' if key in _INTEGERS else 'a number'}") from None
        values[key] = value
    spec = WireSpec(**values)
    if not spec.gbps > 0 or not 1 <= spec.rails <= MAX_RAILS or spec.latency_us < 0 \
            or spec.op_ns < 0 or spec.gbps > 1e6 or spec.atomic_rtt not in (0, 1):
        raise ValueError(f"environment variable {variable}={text!r}: expected gbps in (0, 1e6], "
                         f"latency_us >= 0, op_ns >= 0, 1 <= rails <= {MAX_RAILS} and "
                         "atomic_rtt 0 or 1")
    return spec

// The emulated network's device side (wire_model.h): a put or a signal occupies its channel's
// rail from max(now, rail idle) for op_ns + bytes / rate and is delivered latency_ns after
// that. The data of a put lands at once; a signal waits, on the sending warp, for its own
// delivery (and the fence of an atomic after writes) before it is released; an eager put's
// tiles carry their delivery instants to the receiver instead, so the sender goes on. A rail serves
// its operations in order, so that delivery is no earlier than that of every put posted before it
// on the channel. The rail's "idle at" word advances by compare-and-swap, as the warps of every
// block using the rail share it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "hybrid_ep/common/ptx.cuh"
#include "hybrid_ep/transport/eager_delivery.h"
#include "wire_model.h"

namespace hybrid_ep::wire {

// Lane 0 only: occupies the channel's rail for one operation of `bytes`; returns the instant
// the operation started on it.
__device__ __forceinline__ uint64_t post_start(const WireModel& w, int channel, size_t bytes) {
  const uint64_t cost = w.op_ns + uint64_t(bytes) * w.fs_per_byte / 1000000ull;
  unsigned long long* idle = w.rail_free + channel % w.rails;
  const uint64_t now = ptx::global_timer_ns();
  unsigned long long seen = *reinterpret_cast<volatile unsigned long long*>(idle), expected;
  uint64_t start;
  do {
    expected = seen;
    start = now > expected ? now : expected;
    seen = atomicCAS(idle, expected, start + cost);
  } while (seen != expected);
  return start;
}

// Lane 0 only: as post_start; returns the operation's delivery.
__device__ __forceinline__ uint64_t post(const WireModel& w, int channel, size_t bytes) {
  return post_start(w, channel, bytes) + w.op_ns + uint64_t(bytes) * w.fs_per_byte / 1000000ull +
         w.latency_ns;
}

// The warp reconverges before its copy: lanes 1-31 left to start it without lane 0 would
// leave lane 0 to run its share alone afterwards, doubling the copy's issue.
__device__ __forceinline__ void record_put(const WireModel& w, int channel, size_t bytes,
                                           int lane) {
  if (!w.enabled) return;
  if (lane == 0) post(w, channel, bytes);
  __syncwarp();
}

// Before a signal is released: waits until the emulated NIC has delivered it, fenced after
// the writes before it (fence_ns).
__device__ __forceinline__ void hold_signal(const WireModel& w, int channel, int lane) {
  if (!w.enabled) return;
  if (lane == 0) {
    const uint64_t due = post(w, channel, sizeof(uint64_t)) + w.fence_ns;
    while (ptx::global_timer_ns() < due) {
    }
  }
  __syncwarp();
}

// An eager put of `bytes` in the tile layout (one operation, its tiles landing as the rail
// carries them): when each of its bytes is delivered. Not emulated: nothing to wait for.
__device__ __forceinline__ EagerDelivery eager_put(const WireModel& w, int channel, size_t bytes,
                                                   int lane) {
  EagerDelivery d;
  if (w.enabled) {
    uint64_t start = 0;
    if (lane == 0) start = post_start(w, channel, bytes);
    start = __shfl_sync(~0u, start, 0);
    d = {start == 0 ? 1 : start, w.op_ns, w.fs_per_byte, w.latency_ns};
  }
  __syncwarp();
  return d;
}

}  // namespace hybrid_ep::wire

// A warp's copy between device addresses another process may own (a peer's mapped buffer):
// up to kUnroll 16-byte loads per lane in flight before their stores, bytes when unaligned. One
// load then one store per round left a warp at about 1 GB/s, which bounded the network leg.
#pragma once

#include <cstddef>
#include <cstdint>

#include "hybrid_ep/common/ptx.cuh"
#include "hybrid_ep/transport/counting.cuh"

namespace hybrid_ep {

__device__ __forceinline__ void warp_copy(void* dst, const void* src, size_t bytes, int lane) {
  constexpr int kUnroll = 8;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | bytes) & 15) != 0) {
    uint8_t* d = static_cast<uint8_t*>(dst);
    const uint8_t* s = static_cast<const uint8_t*>(src);
    for (size_t i = lane; i < bytes; i += 32) d[i] = s[i];
    return;
  }
  uint4* d = static_cast<uint4*>(dst);
  const uint4* s = static_cast<const uint4*>(src);
  const size_t count = bytes / 16;
  // Every round keeps each lane's kUnroll loads in flight, the last (partial) one too: a tail
  // copied a vector at a time left one lane running 8 serial load-store pairs for a 4080-byte
  // piece while the warp waited (the eager form's tiles, run s19e).
  for (size_t base = 0; base < count; base += kUnroll * 32) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = base + u * 32 + lane;
      if (i < count) v[u] = s[i];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = base + u * 32 + lane;
      if (i < count) d[i] = v[u];
    }
  }
}

// The signal of a peer whose buffer is mapped: every lane's earlier stores, then lane 0's
// system-scope release add, which the peer's acquire poll sees after the data.
__device__ __forceinline__ void mapped_signal(uint64_t* flag, uint64_t value, int lane) {
  __syncwarp();
  if (lane == 0) {
    __threadfence_system();
    ptx::add_release_sys(flag, value);
  }
  __syncwarp();
}

// A put and a signal to a peer mapped into this process (p2p always; nixl and nvshmem where
// their library maps the peer): our warp's stores, counted like every put and signal.
__device__ __forceinline__ void mapped_put(ChannelCounters* counters, int channel, uint8_t* dst,
                                           const void* src, size_t bytes, int lane) {
  warp_copy(dst, src, bytes, lane);
  count_put(counters, channel, bytes, lane);
}

__device__ __forceinline__ void mapped_signal_counted(ChannelCounters* counters, int channel,
                                                      uint64_t* flag, uint64_t value, int lane) {
  mapped_signal(flag, value, lane);
  count_signal(counters, channel, lane);
  __syncwarp();
}

}  // namespace hybrid_ep

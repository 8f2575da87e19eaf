// p2p transport, device side: puts are the warp's stores into the peer's mapped buffer
// (warp_copy.cuh), a signal is a system-scope release add after the warp's stores, and
// nothing remains to flush once they are issued.
#pragma once

#include <cstdint>

#include "hybrid_ep/transport/warp_copy.cuh"
#include "transport_backend.h"

namespace hybrid_ep {

struct TransportDevice {
  __device__ static void put(const TransportContext& ctx, int channel, int node,
                             size_t remote_offset, const void* src, size_t bytes, int lane) {
    warp_copy(ctx.node_bases[node] + remote_offset, src, bytes, lane);
    if (lane == 0) {
      atomicAdd(&ctx.counters[channel].puts, 1ull);
      atomicAdd(&ctx.counters[channel].bytes, static_cast<unsigned long long>(bytes));
    }
  }

  __device__ static void signal(const TransportContext& ctx, int channel, int node,
                                size_t flag_offset, uint64_t value, int lane) {
    mapped_signal(reinterpret_cast<uint64_t*>(ctx.node_bases[node] + flag_offset), value, lane);
    if (lane == 0) atomicAdd(&ctx.counters[channel].signals, 1ull);
    __syncwarp();
  }

  __device__ static void flush(const TransportContext&, int, int) { __syncwarp(); }
};

}  // namespace hybrid_ep

// p2p transport, device side: puts are the warp's 16-byte stores into the peer's mapped
// buffer, eight loads per lane in flight (bytes when unaligned), a signal is a system-scope
// release add after the warp's stores, and nothing remains to flush once they are issued.
#pragma once

#include <cstdint>

#include "hybrid_ep/kernels/common/ptx.cuh"
#include "transport_backend.h"

namespace hybrid_ep {

struct TransportDevice {
  // A warp's copy with kUnroll 16-byte loads per lane in flight before their stores: one load
  // then one store per round left a warp at about 1 GB/s, which bounded the network leg.
  static constexpr int kUnroll = 8;
  __device__ static void copy_vectors(uint4* dst, const uint4* src, size_t count, int lane) {
    size_t i = lane;
    for (; i + (kUnroll - 1) * 32 < count; i += kUnroll * 32) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = src[i + u * 32];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) dst[i + u * 32] = v[u];
    }
    for (; i < count; i += 32) dst[i] = src[i];
  }

  __device__ static void put(const TransportContext& ctx, int channel, int node,
                             size_t remote_offset, const void* src, size_t bytes, int lane) {
    uint8_t* dst = ctx.node_bases[node] + remote_offset;
    const uint8_t* from = static_cast<const uint8_t*>(src);
    if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(from) | bytes) & 15) ==
        0) {
      copy_vectors(reinterpret_cast<uint4*>(dst), reinterpret_cast<const uint4*>(from), bytes / 16,
                   lane);
    } else {
      for (size_t i = lane; i < bytes; i += 32) dst[i] = from[i];
    }
    if (lane == 0) {
      atomicAdd(&ctx.counters[channel].puts, 1ull);
      atomicAdd(&ctx.counters[channel].bytes, static_cast<unsigned long long>(bytes));
    }
  }

  __device__ static void signal(const TransportContext& ctx, int channel, int node,
                                size_t flag_offset, uint64_t value, int lane) {
    __syncwarp();  // orders every lane's earlier stores before lane 0's release below
    if (lane == 0) {
      __threadfence_system();
      ptx::add_release_sys(reinterpret_cast<uint64_t*>(ctx.node_bases[node] + flag_offset), value);
      atomicAdd(&ctx.counters[channel].signals, 1ull);
    }
    __syncwarp();
  }

  __device__ static void flush(const TransportContext&, int, int) { __syncwarp(); }
};

}  // namespace hybrid_ep

// p2p transport, device side: puts are the warp's stores into the peer's mapped buffer
// (warp_copy.cuh), a signal is a system-scope release add after the warp's stores, and
// nothing remains to flush once they are issued. Under the emulated network (wire_model.cuh)
// every put, and every store the kernel made into a mapped peer in place of one
// (count_stored), occupies the emulated rail, and a signal is held until the NIC would have
// delivered it.
#pragma once

#include <cstdint>

#include "hybrid_ep/common/ptx.cuh"
#include "hybrid_ep/memory/eager_tiles.h"
#include "hybrid_ep/transport/counting.cuh"
#include "hybrid_ep/transport/warp_copy.cuh"
#include "transport_backend.h"
#include "wire_model.cuh"

namespace hybrid_ep {

struct TransportDevice {
  __device__ static void put(const TransportContext& ctx, int channel, int node,
                             size_t remote_offset, const void* src, size_t bytes, int lane) {
    // Posted when called, as a NIC's put; the copy standing in for its transfer comes after.
    wire::record_put(ctx.wire, channel, bytes, lane);
    mapped_put(ctx.counters, channel, ctx.node_bases[node] + remote_offset, src, bytes, lane);
  }

  __device__ static void signal(const TransportContext& ctx, int channel, int node,
                                size_t flag_offset, uint64_t value, int lane) {
    wire::hold_signal(ctx.wire, channel, lane);
    mapped_signal_counted(ctx.counters, channel,
                          reinterpret_cast<uint64_t*>(ctx.node_bases[node] + flag_offset), value,
                          lane);
  }

  __device__ static void flush(const TransportContext&, int, int) { __syncwarp(); }

  __device__ static uint8_t* mapped(const TransportContext& ctx, int node) {
    return ctx.unmapped ? nullptr : ctx.node_bases[node];
  }

  __device__ static void count_stored(const TransportContext& ctx, int channel, size_t bytes,
                                      int lane) {
    wire::record_put(ctx.wire, channel, bytes, lane);  // the kernel's stores stand for a put
    count_put(ctx.counters, channel, bytes, lane);
  }

  __device__ static EagerDelivery count_eager_stored(const TransportContext& ctx, int channel,
                                                     size_t bytes, int64_t tiles, int lane) {
    count_put(ctx.counters, channel, bytes, lane);
    count_eager_tiles(ctx.counters, channel, tiles, lane);
    return wire::eager_put(ctx.wire, channel, bytes, lane);
  }

  // An RDMA write's order, emulated (reached only with peers=unmapped): every tile's data, then
  // one release fence, then the signals, each with the instant the wire delivers it.
  __device__ static void put_eager(const TransportContext& ctx, int channel, int node,
                                   size_t remote_offset, const uint8_t* src, int64_t payload_bytes,
                                   int lane) {
    const int64_t tiles = EagerTiles::count(payload_bytes);
    const int64_t wire_bytes = EagerTiles::wire_bytes(payload_bytes);
    const EagerDelivery due = wire::eager_put(ctx.wire, channel, size_t(wire_bytes), lane);
    count_put(ctx.counters, channel, size_t(wire_bytes), lane);
    count_eager_tiles(ctx.counters, channel, tiles, lane);
    uint8_t* dst = ctx.node_bases[node] + remote_offset;
    __syncwarp();
    if (lane == 0) ptx::fence_acq_rel_sys();  // the slot's stores, by any warp, before the copy
    __syncwarp();
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t at = t * EagerTiles::kTileBytes;
      warp_copy(dst + at, src + at, size_t(EagerTiles::signal_offset(payload_bytes, t)), lane);
    }
    __syncwarp();
    if (lane == 0) ptx::fence_acq_rel_sys();
    __syncwarp();
    for (int64_t t = lane; t < tiles; t += 32) {
      const int64_t at = EagerTiles::signal_at(payload_bytes, t);
      const uint64_t value = reinterpret_cast<const EagerSignal*>(src + at)->value;
      ptx::store_pair_relaxed_sys(&reinterpret_cast<EagerSignal*>(dst + at)->value, value,
                                  due.at(at + EagerTiles::kSignalBytes));
    }
    __syncwarp();
  }
};

}  // namespace hybrid_ep

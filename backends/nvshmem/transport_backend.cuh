// nvshmem transport, device side: a put is NVSHMEM's warp-wide non-blocking put to the peer's
// PE at the same symmetric offset (P2P: the warp's stores, done on return; IBGDA: RDMA writes
// from the registered buffer). A signal is an atomic add on the peer's flag after
// nvshmem_fence: NVSHMEM orders nothing between earlier non-blocking puts and a later signal
// to the same PE without it. A flush is nvshmem_quiet: it returns once this thread's puts are
// complete, so their sources may be reused. Counters count exactly as the p2p backend does.
// Waits stay plain acquire loads of local memory (kernels/common/flags.cuh).
// Where NVSHMEM maps the peer's heap into this process (ctx.mapped: P2P/NVLink), a put is our
// warp copy into it and a signal a system-scope release add, as with p2p and nixl's cuda_ipc
// peers: nvshmemx_putmem_nbi_warp over P2P made a 2x2 dispatch take 2545 us against p2p's
// 1376 us (benchmarks/results/2026-11-29-nvshmem.md). A flush calls nvshmem_quiet only when
// some peer is not mapped (ctx.posts): with every peer mapped nothing went through NVSHMEM, and
// an unbounded library wait stays out of the kernels (HYBRID_EP_TIMEOUT_S bounds ours).
#pragma once

#include <cstdint>

#include "hybrid_ep/memory/eager_tiles.h"
#include "hybrid_ep/transport/eager_delivery.h"
#include "hybrid_ep/transport/warp_copy.cuh"
#include "nvshmem.h"
#include "nvshmemx.h"
#include "transport_backend.h"

namespace hybrid_ep {

struct TransportDevice {
  __device__ static int pe(const TransportContext& ctx, int node) {
    return node * ctx.ranks + ctx.local_rank;
  }

  __device__ static void put(const TransportContext& ctx, int channel, int node,
                             size_t remote_offset, const void* src, size_t bytes, int lane) {
    if (uint8_t* mapped = ctx.mapped[node]) {
      mapped_put(ctx.counters, channel, mapped + remote_offset, src, bytes, lane);
      return;
    }
    nvshmemx_putmem_nbi_warp(ctx.base + remote_offset, src, bytes, pe(ctx, node));
    count_put(ctx.counters, channel, bytes, lane);
  }

  __device__ static void signal(const TransportContext& ctx, int channel, int node,
                                size_t flag_offset, uint64_t value, int lane) {
    if (uint8_t* mapped = ctx.mapped[node]) {
      // Orders this warp's stores (every lane's) before the add; a mapped peer got no
      // NVSHMEM put, so there is nothing for nvshmem_fence to order.
      mapped_signal_counted(ctx.counters, channel,
                            reinterpret_cast<uint64_t*>(mapped + flag_offset), value, lane);
      return;
    }
    __syncwarp();  // every lane's part of the earlier puts is issued before lane 0 fences
    if (lane == 0) {
      nvshmem_fence();
      nvshmemx_signal_op(reinterpret_cast<uint64_t*>(ctx.base + flag_offset), value,
                         NVSHMEM_SIGNAL_ADD, pe(ctx, node));
    }
    count_signal(ctx.counters, channel, lane);
    __syncwarp();
  }

  __device__ static void flush(const TransportContext& ctx, int, int lane) {
    __syncwarp();
    if (ctx.posts && lane == 0) nvshmem_quiet();
    __syncwarp();
  }

  __device__ static uint8_t* mapped(const TransportContext& ctx, int node) {
    return ctx.mapped[node];
  }

  __device__ static void count_stored(const TransportContext& ctx, int channel, size_t bytes,
                                      int lane) {
    count_put(ctx.counters, channel, bytes, lane);
  }

  __device__ static EagerDelivery count_eager_stored(const TransportContext& ctx, int channel,
                                                     size_t bytes, int64_t tiles, int lane) {
    count_put(ctx.counters, channel, bytes, lane);
    count_eager_tiles(ctx.counters, channel, tiles, lane);
    return {};
  }

  // One non-blocking put of the slot (IBGDA: RDMA writes on one RC queue pair, which land in
  // order with relaxed ordering off: the host checks that before it enables the form).
  __device__ static void put_eager(const TransportContext& ctx, int channel, int node,
                                   size_t remote_offset, const uint8_t* src, int64_t payload_bytes,
                                   int lane) {
    const size_t bytes = size_t(EagerTiles::wire_bytes(payload_bytes));
    __syncwarp();
    if (lane == 0) __threadfence_system();  // the slot's stores, by any warp, before the NIC reads
    __syncwarp();
    nvshmemx_putmem_nbi_warp(ctx.base + remote_offset, src, bytes, pe(ctx, node));
    count_put(ctx.counters, channel, bytes, lane);
    count_eager_tiles(ctx.counters, channel, EagerTiles::count(payload_bytes), lane);
  }
};

}  // namespace hybrid_ep

// nixl transport, device side: puts and signals through UCX's device API on the memory views
// the NIXL agents prepared (ucx_device.cuh). A put reads from our registered buffer (element 0
// of the local view) and writes element 0 of the peer's remote view; UCX channel = our channel
// (UCX spreads channels over its lanes, i.e. rails, first). A signal is a counter add on the
// peer's 64-bit flag, ordered after the channel's puts. A put UCX leaves in progress is kept in
// the warp's pending slot; flush progresses it until it completes. Counters count as the p2p
// backend does: one put and its bytes per put call, one signal per signal call.
// Where UCX maps a peer's buffer into this process (a cuda_ipc lane: ctx.mapped), a put is our
// warp's stores and a signal a release add, as with p2p: UCX's warp copy over cuda_ipc moved
// about half as much (benchmarks/results/2026-11-29-nixl.md).
#pragma once

#include <cstdint>

#include "hybrid_ep/common/ptx.cuh"
#include "hybrid_ep/memory/eager_tiles.h"
#include "hybrid_ep/transport/eager_delivery.h"
#include "hybrid_ep/transport/registered_source.cuh"
#include "hybrid_ep/transport/warp_copy.cuh"
#include "hybrid_ep/transport/warp_slot.cuh"
#include "transport_backend.h"
#include "ucx_device.cuh"

namespace hybrid_ep {

static_assert(sizeof(ucp_device_request_t) <= sizeof(NixlPending::request),
              "NixlPending::request must hold a ucp_device_request_t");

namespace nixl_device {

__device__ __forceinline__ NixlPending* warp_slot(const TransportContext& ctx) {
  return hybrid_ep::warp_slot(ctx.pending, ctx.pending_slots);
}

__device__ __forceinline__ ucp_device_request_t* request_of(NixlPending* slot) {
  return reinterpret_cast<ucp_device_request_t*>(slot->request);
}

// Progresses the slot's request to completion (all lanes); a failure, or no completion within
// HYBRID_EP_TIMEOUT_S (ctx.flush_timeout_ns), leaves a fault bit.
__device__ inline void complete(const TransportContext& ctx, NixlPending* slot, int lane) {
  if (!slot->in_flight) return;
  const uint64_t start = ptx::global_timer_ns();
  ucs_status_t status;
  do {
    status = ucx_device::progress(request_of(slot));
  } while (status == UCS_INPROGRESS && ptx::global_timer_ns() - start < ctx.flush_timeout_ns);
  __syncwarp();
  if (lane == 0) {
    if (status != UCS_OK) atomicOr(ctx.fault, unsigned(kNixlFaultCompletion));
    slot->in_flight = 0;
  }
  __syncwarp();
}

}  // namespace nixl_device

struct TransportDevice {
  __device__ static void put(const TransportContext& ctx, int channel, int node,
                             size_t remote_offset, const void* src, size_t bytes, int lane) {
    if (uint8_t* mapped = ctx.mapped[node]) {
      mapped_put(ctx.counters, channel, mapped + remote_offset, src, bytes, lane);
      return;
    }
    count_put(ctx.counters, channel, bytes, lane);
    uint64_t local;
    if (!registered_source_offset(ctx.local_base, ctx.local_bytes, src, bytes, ctx.fault,
                                  kNixlFaultSourceOutside, lane, &local)) {
      return;
    }
    NixlPending* slot = nixl_device::warp_slot(ctx);
    // A put on another channel than the one in flight: complete that one first, the slot
    // tracks one channel.
    if (slot != nullptr && slot->in_flight && slot->channel != channel) {
      nixl_device::complete(ctx, slot, lane);
    }
    ucp_device_request_t* request = slot != nullptr ? nixl_device::request_of(slot) : nullptr;
    const ucs_status_t status = ucx_device::put(ctx.local_view, ctx.remote_views[node], local,
                                                remote_offset, bytes, unsigned(channel), request);
    __syncwarp();
    if (lane == 0) {
      if (status == UCS_INPROGRESS && slot != nullptr) {
        slot->in_flight = 1;
        slot->channel = channel;
      } else if (status != UCS_OK && status != UCS_INPROGRESS) {
        atomicOr(ctx.fault, unsigned(kNixlFaultPost));
      }
    }
    __syncwarp();
  }

  __device__ static void signal(const TransportContext& ctx, int channel, int node,
                                size_t flag_offset, uint64_t value, int lane) {
    if (uint8_t* mapped = ctx.mapped[node]) {
      mapped_signal_counted(ctx.counters, channel,
                            reinterpret_cast<uint64_t*>(mapped + flag_offset), value, lane);
      return;
    }
    // Every lane's share of the earlier puts before the add (cuda_ipc copies with all lanes).
    __syncwarp();
    // After a failed put the peer must not read its rows as arrived: no signal, so its wait
    // times out and reports, and this rank's fault word says why.
    if (*static_cast<volatile unsigned int*>(ctx.fault) != 0) return;
    const ucs_status_t status =
        ucx_device::counter_add(ctx.remote_views[node], flag_offset, value, unsigned(channel));
    count_signal(ctx.counters, channel, lane);
    if (lane == 0 && status != UCS_OK && status != UCS_INPROGRESS) {
      atomicOr(ctx.fault, unsigned(kNixlFaultPost));
    }
    __syncwarp();
  }

  __device__ static void flush(const TransportContext& ctx, int channel, int lane) {
    NixlPending* slot = nixl_device::warp_slot(ctx);
    if (slot != nullptr && slot->channel == channel) nixl_device::complete(ctx, slot, lane);
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

  // One ucp_device_put of the slot (an RDMA write on one lane of the peer's endpoint; the host
  // enables the form only with UCX's PCIe relaxed ordering off).
  __device__ static void put_eager(const TransportContext& ctx, int channel, int node,
                                   size_t remote_offset, const uint8_t* src, int64_t payload_bytes,
                                   int lane) {
    __syncwarp();
    if (lane == 0) __threadfence_system();  // the slot's stores, by any warp, before the NIC reads
    __syncwarp();
    put(ctx, channel, node, remote_offset, src, size_t(EagerTiles::wire_bytes(payload_bytes)),
        lane);
    count_eager_tiles(ctx.counters, channel, EagerTiles::count(payload_bytes), lane);
  }
};

}  // namespace hybrid_ep

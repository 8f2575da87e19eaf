// doca transport, device side: RDMA through DOCA GPUNetIO device verbs on the queue pair of
// (channel, peer). A put is an RDMA write from the registered buffer, batched per warp (see
// wqe_batch.cuh); a signal is an RDMA fetch-add on the peer's 64-bit flag, posted after the
// warp's batched writes on the same queue pair (RC executes them in order) and followed by the
// one doorbell of the batch; a flush rings what is left and polls the completions. Counters
// count exactly as the p2p backend does: one put and its bytes per put call, one signal per
// signal call.
#pragma once

#include <cstdint>

#include "hybrid_ep/memory/eager_tiles.h"
#include "hybrid_ep/transport/counting.cuh"
#include "hybrid_ep/transport/eager_delivery.h"
#include "hybrid_ep/transport/registered_source.cuh"
#include "transport_backend.h"
#include "wqe_batch.cuh"

namespace hybrid_ep {

struct TransportDevice {
  __device__ static void put(const TransportContext& ctx, int channel, int node,
                             size_t remote_offset, const void* src, size_t bytes, int lane) {
    count_put(ctx.counters, channel, bytes, lane);
    uint64_t local;
    if (!registered_source_offset(ctx.local_base, ctx.local_bytes, src, bytes, ctx.fault,
                                  kDocaFaultSourceOutside, lane, &local)) {
      return;
    }
    DocaBatch* batch = doca_device::warp_batch(ctx);
    // One WQE moves at most DOCA_GPUNETIO_VERBS_MAX_TRANSFER_SIZE (1 GiB): larger puts split.
    for (uint64_t done = 0; done < bytes; done += DOCA_GPUNETIO_VERBS_MAX_TRANSFER_SIZE) {
      const uint64_t piece = bytes - done < DOCA_GPUNETIO_VERBS_MAX_TRANSFER_SIZE
                                 ? bytes - done
                                 : DOCA_GPUNETIO_VERBS_MAX_TRANSFER_SIZE;
      const DocaPendingPut p{remote_offset + done, local + done, piece};
      if (batch == nullptr) {  // no batch slot for this warp: post and ring at once
        doca_device::post(ctx, channel, node, &p, 1, nullptr, true, lane);
        continue;
      }
      const int count = batch->count;
      if (count > 0 && (batch->channel != channel || batch->node != node)) {
        doca_device::drain(ctx, batch, nullptr, true, lane);  // another queue pair: ring it
      } else if (count == kDocaBatchCapacity) {
        doca_device::drain(ctx, batch, nullptr, false, lane);  // same queue pair: the signal rings
      }
      __syncwarp();
      if (lane == 0) {
        const int at = batch->count;
        batch->puts[at] = p;
        batch->count = at + 1;
        batch->channel = channel;
        batch->node = node;
      }
      __syncwarp();
    }
  }

  __device__ static void signal(const TransportContext& ctx, int channel, int node,
                                size_t flag_offset, uint64_t value, int lane) {
    count_signal(ctx.counters, channel, lane);
    const doca_device::Signal signal{flag_offset, value};
    DocaBatch* batch = doca_device::warp_batch(ctx);
    if (batch != nullptr && batch->count > 0) {
      if (batch->channel == channel && batch->node == node) {
        doca_device::drain(ctx, batch, &signal, true, lane);
        return;
      }
      doca_device::drain(ctx, batch, nullptr, true, lane);
    }
    doca_device::post(ctx, channel, node, nullptr, 0, &signal, true, lane);
  }

  __device__ static void flush(const TransportContext& ctx, int channel, int lane) {
    DocaBatch* batch = doca_device::warp_batch(ctx);
    if (batch != nullptr && batch->count > 0) doca_device::drain(ctx, batch, nullptr, true, lane);
    doca_device::wait_completions(ctx, channel, lane);
  }

  // Peers are behind a NIC: never mapped, so count_stored is never called.
  __device__ static uint8_t* mapped(const TransportContext&, int) { return nullptr; }

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

  // The slot as RDMA writes on the (channel, peer) queue pair, rung at once: no signal follows
  // to ring them. They land in order (RC, memory registered without relaxed ordering).
  __device__ static void put_eager(const TransportContext& ctx, int channel, int node,
                                   size_t remote_offset, const uint8_t* src, int64_t payload_bytes,
                                   int lane) {
    __syncwarp();
    if (lane == 0) __threadfence_system();  // the slot's stores, by any warp, before the NIC reads
    __syncwarp();
    put(ctx, channel, node, remote_offset, src, size_t(EagerTiles::wire_bytes(payload_bytes)),
        lane);
    DocaBatch* batch = doca_device::warp_batch(ctx);
    if (batch != nullptr && batch->count > 0) doca_device::drain(ctx, batch, nullptr, true, lane);
    count_eager_tiles(ctx.counters, channel, EagerTiles::count(payload_bytes), lane);
  }
};

}  // namespace hybrid_ep

// Work-request posting for the doca transport's device side. A warp's puts wait in its batch
// (DocaBatch, one per warp of a launch) and become WQEs together: one slot reservation for the
// whole batch, lane i builds WQE i, one ready mark, and -- at a signal or flush -- one doorbell.
// So a chunk sent to a peer costs one doorbell however many runs it has.
#pragma once

#include <cstdint>

#include "doca_gpunetio_device.h"
#include "hybrid_ep/transport/warp_slot.cuh"
#include "transport_backend.h"

namespace hybrid_ep::doca_device {

// Several blocks share a channel's queue pair (block b uses channel b % channels).
constexpr auto kSharing = DOCA_GPUNETIO_VERBS_RESOURCE_SHARING_MODE_GPU;
// In CPU-proxy mode DOCA only advances the producer index when asked; flush reads it.
constexpr uint32_t kSubmitOptions = DOCA_GPUNETIO_VERBS_GPU_CODE_OPT_CPU_PROXY_UPDATE_PI;

struct Signal {
  uint64_t flag_offset;
  uint64_t value;
};

__device__ __forceinline__ uint64_t broadcast(uint64_t v) {
  const uint32_t lo = __shfl_sync(0xffffffffu, uint32_t(v), 0);
  const uint32_t hi = __shfl_sync(0xffffffffu, uint32_t(v >> 32), 0);
  return (uint64_t(hi) << 32) | lo;
}

// This warp's batch, or null when the launch has more warps than batch slots.
__device__ __forceinline__ DocaBatch* warp_batch(const TransportContext& ctx) {
  return warp_slot(ctx.batches, ctx.batch_slots);
}

// Posts `count` RDMA writes of `puts` and, with `signal`, a fetch-add ordered after them, as
// consecutive WQEs of the (channel, node) queue pair; rings the doorbell when `ring`. Called by
// all lanes; `puts` may be the batch in global memory or one local descriptor.
__device__ inline void post(const TransportContext& ctx, int channel, int node,
                            const DocaPendingPut* puts, int count, const Signal* signal, bool ring,
                            int lane) {
  const DocaRoute& route = ctx.routes[channel * ctx.nodes + node];
  doca_gpu_dev_verbs_qp* qp = route.qp;
  const int total = count + (signal != nullptr ? 1 : 0);
  if (total == 0) return;
  uint64_t base = 0;
  if (lane == 0) base = doca_gpu_dev_verbs_reserve_wq_slots<kSharing>(qp, uint32_t(total));
  base = broadcast(base);
  const doca_gpu_dev_verbs_wqe_ctrl_flags flags = doca_gpu_dev_verbs_get_ctrl_flags(qp, 0);
  for (int i = lane; i < total; i += 32) {
    const uint64_t index = base + uint64_t(i);
    doca_gpu_dev_verbs_wqe* wqe = doca_gpu_dev_verbs_get_wqe_ptr(qp, uint16_t(index));
    if (i < count) {
      const DocaPendingPut p = puts[i];
      doca_gpu_dev_verbs_wqe_prepare_write(
          qp, wqe, uint16_t(index), DOCA_GPUNETIO_IB_MLX5_OPCODE_RDMA_WRITE, flags, 0,
          route.remote_base + p.remote_offset, route.rkey_be,
          reinterpret_cast<uint64_t>(ctx.local_base) + p.local_offset, route.lkey_be,
          uint32_t(p.bytes));
    } else {
      doca_gpu_dev_verbs_wqe_prepare_atomic(
          qp, wqe, uint16_t(index), DOCA_GPUNETIO_IB_MLX5_OPCODE_ATOMIC_FA, flags,
          route.remote_base + signal->flag_offset, route.rkey_be,
          reinterpret_cast<uint64_t>(ctx.sink), route.sink_lkey_be, sizeof(uint64_t), signal->value,
          signal->value);
    }
  }
  __syncwarp();  // every lane's WQE is written before lane 0 publishes the range
  if (lane == 0) {
    const uint64_t last = base + uint64_t(total) - 1;
    doca_gpu_dev_verbs_mark_wqes_ready<kSharing>(qp, base, last);
    // mark_wqes_ready fenced at GPU scope already, as DOCA's own warp-scope put relies on.
    if (ring) {
      doca_gpu_dev_verbs_submit<kSharing, DOCA_GPUNETIO_VERBS_SYNC_SCOPE_THREAD>(qp, last + 1,
                                                                                 kSubmitOptions);
    }
  }
  __syncwarp();
}

// Turns the batch into WQEs (with `signal` appended when given) and empties it.
__device__ inline void drain(const TransportContext& ctx, DocaBatch* batch, const Signal* signal,
                             bool ring, int lane) {
  const int count = batch->count;
  const int channel = batch->channel, node = batch->node;
  post(ctx, channel, node, batch->puts, count, signal, ring, lane);
  __syncwarp();
  if (lane == 0) batch->count = 0;
  __syncwarp();
}

// Waits until every WQE rung so far on (channel, node) has completed; lane-parallel over nodes.
__device__ inline void wait_completions(const TransportContext& ctx, int channel, int lane) {
  for (int node = lane; node < ctx.nodes; node += 32) {
    if (node == ctx.node_rank) continue;
    doca_gpu_dev_verbs_qp* qp = ctx.routes[channel * ctx.nodes + node].qp;
    const uint64_t rung = doca_gpu_dev_verbs_atomic_read<uint64_t, kSharing>(&qp->sq_wqe_pi);
    if (rung == 0) continue;
    const uint64_t start = doca_gpu_dev_verbs_query_globaltimer();
    int status;
    while ((status = doca_gpu_dev_verbs_poll_one_cq_at<kSharing>(qp, rung - 1)) == EBUSY) {
      // No completion within HYBRID_EP_TIMEOUT_S: a fault instead of a hang.
      if (doca_gpu_dev_verbs_query_globaltimer() - start > ctx.flush_timeout_ns) break;
    }
    if (status != 0) {
      atomicOr(ctx.fault, status == EBUSY ? kDocaFaultFlushTimeout : kDocaFaultCompletion);
    }
  }
  __syncwarp();
}

}  // namespace hybrid_ep::doca_device

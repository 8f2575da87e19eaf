// Routing all-gather: this rank's routing map (zero-padded to T rows), token count and call
// stamp into the routing region of every rank of the domain. Block j writes to local rank j,
// signals it, then waits for local rank j's rows to arrive here, so the kernel ends with the
// gather complete. With several domains a second kernel (one block) then puts this rank's map
// to the peer of every other domain, waits for theirs, and forwards them to the rest of the
// domain. The signals are the domain barrier's (barrier.cu says why), each with the stamp.
#include <algorithm>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/kernels/common/domains.cuh"
#include "hybrid_ep/kernels/common/flags.cuh"
#include "hybrid_ep/kernels/params.h"
#include "hybrid_ep/transport/transport_device.cuh"

namespace hybrid_ep {
namespace {

__global__ void allgather_kernel(AllgatherParams p) {
  const DomainView& d = p.domain;
  if (d.aborted()) return;
  const int peer = blockIdx.x;
  const int my_rank = d.node_rank * d.ranks + d.local_rank;
  const size_t row_bytes = p.experts_total;
  const size_t total = row_bytes * p.max_tokens;
  const size_t valid = row_bytes * min(p.num_tokens, p.max_tokens);
  uint8_t* dst = d.peer(peer) + p.routing + total * my_rank;
  const uint8_t* src = p.routing_map;

  const bool vector_ok =
      ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | total | valid) &
       15) == 0;
  if (vector_ok) {
    for (size_t i = threadIdx.x * 16; i < total; i += blockDim.x * 16) {
      const uint4 v = i < valid ? *reinterpret_cast<const uint4*>(src + i) : make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(dst + i) = v;
    }
  } else {
    for (size_t i = threadIdx.x; i < total; i += blockDim.x) dst[i] = i < valid ? src[i] : 0;
  }
  if (threadIdx.x == 0) {
    reinterpret_cast<uint64_t*>(d.peer(peer) + p.token_counts)[my_rank] = p.num_tokens;
    reinterpret_cast<uint64_t*>(d.peer(peer) + p.call_stamps)[my_rank] = d.stamp;
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    const size_t mine = p.barrier_flags.slot(peer);
    const uint64_t exchange = *d.expected_for(mine) + 1;
    *reinterpret_cast<uint64_t*>(
        d.peer(peer) + stamp_slot(p.barrier_stamps, d.ranks, exchange, d.local_rank)) = d.stamp;
    signal_flag(reinterpret_cast<uint64_t*>(d.peer(peer) + p.barrier_flags.slot(d.local_rank)));
    if (wait_flag(reinterpret_cast<const uint64_t*>(d.self() + mine), d.expected_for(mine), d,
                  WaitSite::kAllgather, peer, 0)) {
      const uint64_t theirs = *reinterpret_cast<const volatile uint64_t*>(
          d.self() + stamp_slot(p.barrier_stamps, d.ranks, exchange, peer));
      stamps_agree(d, theirs, WaitSite::kAllgather, peer);
    }
  }
}

__device__ void copy_bytes(uint8_t* dst, const uint8_t* src, size_t bytes, int thread,
                           int threads) {
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | bytes) & 15) == 0) {
    for (size_t i = thread; i < bytes / 16; i += threads) {
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    }
  } else {
    for (size_t i = thread; i < bytes; i += threads) dst[i] = src[i];
  }
}

__global__ void allgather_network_kernel(AllgatherNetworkParams p) {
  const DomainView& d = p.domain;
  if (d.aborted()) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const size_t map_bytes = size_t(p.experts_total) * p.max_tokens;
  const int me = d.node_rank * d.ranks + d.local_rank;
  uint8_t* self = d.self();
  // 1. This rank's map, count and stamp (the first kernel put them into its own region) to
  // each peer; the stamp also into the barrier's slot, as the barrier's network signal carries.
  for (int k = warp; k < d.nodes - 1; k += warps) {
    const int n = other_domain(k, d.node_rank);
    const size_t slot = stamp_slot(p.net_barrier_stamps, d.nodes,
                                   *d.expected_for(p.net_barrier_flags.slot(n)) + 1, d.node_rank);
    if (lane == 0) *reinterpret_cast<uint64_t*>(self + slot) = stamp_for_network(d);
    __threadfence_system();
    __syncwarp();
    TransportDevice::put(p.transport, 0, n, p.routing + map_bytes * me,
                         self + p.routing + map_bytes * me, map_bytes, lane);
    TransportDevice::put(p.transport, 0, n, p.token_counts + sizeof(uint64_t) * me,
                         self + p.token_counts + sizeof(uint64_t) * me, sizeof(uint64_t), lane);
    TransportDevice::put(p.transport, 0, n, p.call_stamps + sizeof(uint64_t) * me,
                         self + p.call_stamps + sizeof(uint64_t) * me, sizeof(uint64_t), lane);
    TransportDevice::put(p.transport, 0, n, slot, self + slot, sizeof(uint64_t), lane);
    TransportDevice::signal(p.transport, 0, n, p.net_barrier_flags.slot(d.node_rank), 1, lane);
  }
  if (warp < d.nodes - 1) TransportDevice::flush(p.transport, 0, lane);
  __syncthreads();  // every warp read the counters before the waits below advance them
  // 2. The peers' maps are here.
  if (int(threadIdx.x) < d.nodes && int(threadIdx.x) != d.node_rank) {
    const int n = threadIdx.x;
    const size_t mine = p.net_barrier_flags.slot(n);
    const uint64_t exchange = *d.expected_for(mine) + 1;
    if (wait_flag(reinterpret_cast<const uint64_t*>(self + mine), d.expected_for(mine), d,
                  WaitSite::kNetworkAllgather, n, 0)) {
      const uint64_t theirs = *reinterpret_cast<const volatile uint64_t*>(
          self + stamp_slot(p.net_barrier_stamps, d.nodes, exchange, n));
      stamps_agree(d, theirs, WaitSite::kNetworkAllgather, n);
    }
  }
  __syncthreads();
  // A mismatch (found here or in the domain's part) is known to every rank by now: stop before
  // forwarding, as ranks in a barrier instead of this all-gather would never forward theirs.
  if (d.settle()) return;
  // 3. Forward them to every other rank of the domain.
  for (int k = 0; k < d.nodes - 1; ++k) {
    const int source = other_domain(k, d.node_rank) * d.ranks + d.local_rank;
    for (int j = 0; j < d.ranks; ++j) {
      if (j == d.local_rank) continue;
      copy_bytes(d.peer(j) + p.routing + map_bytes * source, self + p.routing + map_bytes * source,
                 map_bytes, threadIdx.x, blockDim.x);
      if (threadIdx.x == 0) {
        reinterpret_cast<uint64_t*>(d.peer(j) + p.token_counts)[source] =
            reinterpret_cast<const uint64_t*>(self + p.token_counts)[source];
        reinterpret_cast<uint64_t*>(d.peer(j) + p.call_stamps)[source] =
            reinterpret_cast<const uint64_t*>(self + p.call_stamps)[source];
      }
    }
  }
  __threadfence_system();
  __syncthreads();
  // 4. Every local rank forwarded its peers' maps here.
  const int j = threadIdx.x;
  if (j < d.ranks && j != d.local_rank) {
    signal_flag(reinterpret_cast<uint64_t*>(d.peer(j) + p.forward_flags.slot(d.local_rank)));
    const size_t mine = p.forward_flags.slot(j);
    wait_flag(reinterpret_cast<const uint64_t*>(self + mine), d.expected_for(mine), d,
              WaitSite::kForward, j, 0);
  }
}

}  // namespace

void launch_allgather(const AllgatherParams& p, cudaStream_t stream) {
  allgather_kernel<<<p.domain.ranks, 512, 0, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

void launch_allgather_network(const AllgatherNetworkParams& p, cudaStream_t stream) {
  const int threads = std::max(512, (std::max(p.domain.nodes, p.domain.ranks) + 31) / 32 * 32);
  allgather_network_kernel<<<1, threads, 0, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hybrid_ep

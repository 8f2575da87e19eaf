// Routing all-gather: this rank's tokens (zero-padded to T), token count and call stamp into
// the routing region of every rank of the domain, as bits of that domain's experts only
// (kernels/common/routing_bits.h). Block j packs them straight into local rank j, signals it,
// then waits for local rank j's rows to arrive here, so the kernel ends with the gather
// complete. With several domains, blocks past R meanwhile pack this rank's bits for each other
// domain into staged_routing, and a second kernel (one block) puts those to the peer of every
// other domain, waits for theirs, and forwards them to the rest of the domain. The signals are
// the domain barrier's (barrier.cu says why), each with the stamp.
#include <algorithm>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/kernels/common/domains.cuh"
#include "hybrid_ep/kernels/common/flags.cuh"
#include "hybrid_ep/kernels/common/routing_bits.h"
#include "hybrid_ep/kernels/params.h"
#include "hybrid_ep/transport/transport_device.cuh"

namespace hybrid_ep {
namespace {

// Words [first, T * words) step `step` of this rank's bits for domain n, [T, words], into `out`
// (a peer's routing row or the staging); zero past this rank's tokens.
__device__ void pack_domain(const AllgatherParams& p, int n, uint32_t* out, int64_t first,
                            int64_t step) {
  const int words = p.routing_words;
  const int64_t valid = int64_t(min(p.num_tokens, p.max_tokens)) * words;
  const int64_t total = int64_t(p.max_tokens) * words;
  const int64_t row_bytes = int64_t(p.domain_cols) * p.domain.nodes;
  const bool vector = routing_vector_reads(p.routing_map, p.domain_cols);
  for (int64_t i = first; i < total; i += step) {
    const int64_t t = i / words;
    out[i] = i < valid ? routing_word_of_row(p.routing_map + t * row_bytes, p.domain_cols, n,
                                             int(i % words), vector)
                       : 0;
  }
}

__global__ void allgather_kernel(AllgatherParams p) {
  const DomainView& d = p.domain;
  if (d.aborted()) return;
  const size_t row_bytes = sizeof(uint32_t) * p.routing_words * size_t(p.max_tokens);
  if (int(blockIdx.x) >= d.ranks) {  // a staging block: every other domain's bits, no waits
    const int b = blockIdx.x - d.ranks;
    for (int k = 0; k < d.nodes - 1; ++k) {
      uint32_t* out = reinterpret_cast<uint32_t*>(d.self() + p.staged_routing + row_bytes * k);
      pack_domain(p, other_domain(k, d.node_rank), out, int64_t(b) * blockDim.x + threadIdx.x,
                  int64_t(p.staging_blocks) * blockDim.x);
    }
    return;
  }
  const int peer = blockIdx.x;
  const int my_rank = d.node_rank * d.ranks + d.local_rank;
  pack_domain(p, d.node_rank,
              reinterpret_cast<uint32_t*>(d.peer(peer) + p.routing + row_bytes * my_rank),
              threadIdx.x, blockDim.x);
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
  const size_t map_bytes = sizeof(uint32_t) * p.routing_words * size_t(p.max_tokens);
  const int me = d.node_rank * d.ranks + d.local_rank;
  uint8_t* self = d.self();
  // 1. This rank's bits for domain n (staged by the first kernel), count and stamp (in its own
  // region) to the peer there, into row `me` of its routing; the stamp also into the barrier's
  // slot, as the barrier's network signal carries.
  for (int k = warp; k < d.nodes - 1; k += warps) {
    const int n = other_domain(k, d.node_rank);
    const size_t slot = stamp_slot(p.net_barrier_stamps, d.nodes,
                                   *d.expected_for(p.net_barrier_flags.slot(n)) + 1, d.node_rank);
    if (lane == 0) *reinterpret_cast<uint64_t*>(self + slot) = stamp_for_network(d);
    __threadfence_system();
    __syncwarp();
    TransportDevice::put(p.transport, 0, n, p.routing + map_bytes * me,
                         self + p.staged_routing + map_bytes * k, map_bytes, lane);
    TransportDevice::put(p.transport, 0, n, p.token_counts + sizeof(uint64_t) * me,
                         self + p.token_counts + sizeof(uint64_t) * me, sizeof(uint64_t), lane);
    TransportDevice::put(p.transport, 0, n, p.call_stamps + sizeof(uint64_t) * me,
                         self + p.call_stamps + sizeof(uint64_t) * me, sizeof(uint64_t), lane);
    TransportDevice::put(p.transport, 0, n, slot, self + slot, sizeof(uint64_t), lane);
    TransportDevice::signal(p.transport, 0, n, p.net_barrier_flags.slot(d.node_rank), 1, lane);
  }
  if (warp < d.nodes - 1) TransportDevice::flush(p.transport, 0, lane);
  __syncthreads();  // every warp read the counters before the waits below advance them
  // 2. The peers' rows are here.
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
  // 3. Forward them (this domain's bits) to every other rank of the domain.
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
  // 4. Every local rank forwarded its peers' rows here.
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
  allgather_kernel<<<p.domain.ranks + p.staging_blocks, 512, 0, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

void launch_allgather_network(const AllgatherNetworkParams& p, cudaStream_t stream) {
  const int threads = std::max(512, (std::max(p.domain.nodes, p.domain.ranks) + 31) / 32 * 32);
  allgather_network_kernel<<<1, threads, 0, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hybrid_ep

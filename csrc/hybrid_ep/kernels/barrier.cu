// Domain barrier: every local rank bumps its slot in every peer, then waits for all slots.
// Runs between operations so that no rank overwrites a peer's buffer that is still being read.
#include "hybrid_ep/kernels/common/flags.cuh"
#include "hybrid_ep/kernels/params.h"
#include "hybrid_ep/runtime/cuda_check.h"

namespace hybrid_ep {
namespace {

__global__ void domain_barrier_kernel(BarrierParams p) {
  const DomainView& d = p.domain;
  const int peer = threadIdx.x;
  if (peer >= d.ranks || d.aborted()) return;
  const size_t slot = sizeof(uint64_t) * d.local_rank;
  signal_flag(reinterpret_cast<uint64_t*>(d.peer(peer) + p.barrier_flags + slot));
  const size_t mine = p.barrier_flags + sizeof(uint64_t) * peer;
  wait_flag(reinterpret_cast<const uint64_t*>(d.self() + mine), d.expected_for(mine), d.timeout_ns,
            d.status, d.abort, WaitSite::kBarrier, peer, 0);
}

}  // namespace

void launch_domain_barrier(const BarrierParams& p, cudaStream_t stream) {
  const int threads = (p.domain.ranks + 31) / 32 * 32;
  domain_barrier_kernel<<<1, threads, 0, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hybrid_ep

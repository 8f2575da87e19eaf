// Routing all-gather: this rank's routing map (zero-padded to T rows) and token count into the
// routing region of every rank of the domain. Block j writes to local rank j, signals it, then
// waits for local rank j's rows to arrive here, so the kernel ends with the gather complete.
#include "hybrid_ep/kernels/common/flags.cuh"
#include "hybrid_ep/kernels/params.h"
#include "hybrid_ep/runtime/cuda_check.h"

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
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    signal_flag(reinterpret_cast<uint64_t*>(d.peer(peer) + p.allgather_flags +
                                            sizeof(uint64_t) * d.local_rank));
    const size_t mine = p.allgather_flags + sizeof(uint64_t) * peer;
    wait_flag(reinterpret_cast<const uint64_t*>(d.self() + mine), d.expected_for(mine),
              d.timeout_ns, d.status, d.abort, WaitSite::kAllgather, peer, 0);
  }
}

}  // namespace

void launch_allgather(const AllgatherParams& p, cudaStream_t stream) {
  allgather_kernel<<<p.domain.ranks, 512, 0, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hybrid_ep

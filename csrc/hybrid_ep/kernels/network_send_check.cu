// Check of the network leg of dispatch (the run building, the puts and the per-chunk signals)
// before the dispatch kernel uses it: one warp per block sends the block's chunks to the peer
// of every other domain, then waits for the chunks those peers send to it.
#include <algorithm>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/kernels/common/domains.cuh"
#include "hybrid_ep/kernels/common/flags.cuh"
#include "hybrid_ep/kernels/common/ring_credits.cuh"
#include "hybrid_ep/kernels/network_send.cuh"
#include "hybrid_ep/kernels/params.h"

namespace hybrid_ep {
namespace {

struct GoesTo {
  const bool* goes;
  int stride;  // N - 1
  int k;       // the destination's index among the other domains
  __device__ bool operator()(int t) const { return goes[int64_t(t) * stride + k]; }
};

__global__ void __launch_bounds__(32) network_send_check_kernel(NetworkSendCheckParams p) {
  if (p.domain.aborted()) return;
  extern __shared__ TokenRun runs[];
  const int lane = threadIdx.x;
  const TransportContext& t = p.transport;
  const int channel = blockIdx.x % t.channels;
  const int chunks = (p.num_tokens + p.chunk - 1) / p.chunk;
  const NetTensor none{nullptr, 0, 0};
  for (int c = blockIdx.x; c < chunks; c += gridDim.x) {
    const int first = c * p.chunk;
    const int last = min(first + p.chunk, p.num_tokens);
    for (int node = 0; node < t.nodes; ++node) {
      if (node == t.node_rank) continue;
      const int64_t base =
          ring_token_base(other_domain_index(t.node_rank, node), c, p.ring_chunks, p.chunk);
      const NetTensor tensors[kMaxNetTensors] = {
          {p.rows, p.net_rows + size_t(base * p.row_bytes), p.row_bytes}, none, none};
      const GoesTo selected{p.goes, t.nodes - 1, other_domain_index(node, t.node_rank)};
      const size_t flag = p.network_flags.slot(t.node_rank, c);
      send_chunk(t, channel, node, selected, first, last, tensors, flag, runs, lane);
    }
  }
  for (int c = blockIdx.x; c < chunks; c += gridDim.x) {
    for (int node = 0; node < t.nodes; ++node) {
      if (node == t.node_rank || lane != 0) continue;
      const size_t flag = p.network_flags.slot(node, c);
      if (!wait_flag(reinterpret_cast<const uint64_t*>(p.domain.self() + flag),
                     p.domain.expected_for(flag), p.domain, WaitSite::kNetworkFlag, node, c)) {
        return;
      }
    }
  }
}

}  // namespace

void launch_network_send_check(const NetworkSendCheckParams& p, int blocks, cudaStream_t stream) {
  const size_t smem = sizeof(TokenRun) * size_t((p.chunk + 1) / 2 + 1);
  network_send_check_kernel<<<std::max(1, blocks), 32, smem, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hybrid_ep

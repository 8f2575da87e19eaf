// Dest-major probability restripe (several domains): probs [num_tokens, N * E*R], token-major,
// become [N, T, E*R], so that the probs a run of tokens carries to one destination domain are
// one contiguous block and go in one put instead of one per token.
#include <algorithm>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/kernels/params.h"

namespace hybrid_ep {
namespace {

__global__ void restripe_kernel(RestripeParams p) {
  const int64_t per_token = int64_t(p.nodes) * p.prob_cols;
  const int64_t total = int64_t(p.num_tokens) * per_token;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / per_token;
    const int n = int((i % per_token) / p.prob_cols);
    const int col = int(i % p.prob_cols);
    p.restriped[(int64_t(n) * p.max_tokens + t) * p.prob_cols + col] = p.probs[i];
  }
}

}  // namespace

void launch_restripe(const RestripeParams& p, cudaStream_t stream) {
  const int64_t total = int64_t(p.num_tokens) * p.nodes * p.prob_cols;
  if (total == 0) return;
  const int blocks = int(std::min<int64_t>((total + 255) / 256, 1024));
  restripe_kernel<<<blocks, 256, 0, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hybrid_ep

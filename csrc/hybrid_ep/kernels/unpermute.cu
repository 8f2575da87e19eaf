// Unpermute: every dispatch row's expert outputs summed in fp32 (ascending expert, as the
// reference adds them) straight into the registered combine region, where the combine kernels
// of the domain pull them. One warp per dispatch row; the row count D is read on the device,
// so the launch needs no host synchronisation (non-blocking mode, CUDA graphs).
#include <algorithm>

#include "hybrid_ep/kernels/common/bf16.cuh"
#include "hybrid_ep/kernels/params.h"
#include "hybrid_ep/runtime/cuda_check.h"

namespace hybrid_ep {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) unpermute_kernel(UnpermuteParams p) {
  const int lane = threadIdx.x % 32;
  const int warps = gridDim.x * (kThreads / 32);
  const int rows = *p.num_dispatched;
  const int E = p.experts_per_rank;
  const int vectors = p.hidden_size / 8;
  for (int i = blockIdx.x * (kThreads / 32) + threadIdx.x / 32; i < rows; i += warps) {
    const int32_t* targets = p.dense_to_expert_map + int64_t(i) * E;
    float4* dst = reinterpret_cast<float4*>(p.dense + int64_t(i) * p.hidden_size);
    for (int v = lane; v < vectors; v += 32) {
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int e = 0; e < E; ++e) {
        const int32_t r = targets[e];
        if (r < 0) continue;
        accumulate(acc, reinterpret_cast<const uint4*>(p.hidden + int64_t(r) * p.hidden_size)[v]);
      }
      dst[2 * v] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      dst[2 * v + 1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    }
    if (p.dense_probs != nullptr) {
      float* probs = p.dense_probs + int64_t(i) * p.prob_cols + p.prob_col_offset;
      for (int e = lane; e < E; e += 32) {
        const int32_t r = targets[e];
        probs[e] = r >= 0 && p.probs != nullptr ? p.probs[r] : 0.f;
      }
    }
  }
}

}  // namespace

void launch_unpermute(const UnpermuteParams& p, int blocks, cudaStream_t stream) {
  unpermute_kernel<<<std::max(blocks, 1), kThreads, 0, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hybrid_ep

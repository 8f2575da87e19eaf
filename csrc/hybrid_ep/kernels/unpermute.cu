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

constexpr int kVectorsInFlight = 2;  // 16-byte vectors per lane summed side by side

// The row's expert targets live in lanes (lane e holds target e, E <= 32 at a time) and are
// broadcast by shuffles, so the inner loop issues only the loads of the rows it adds; a lane
// sums kVectorsInFlight vectors at once to keep several loads in flight.
__global__ void __launch_bounds__(kThreads) unpermute_kernel(UnpermuteParams p) {
  const int lane = threadIdx.x % 32;
  const int warps = gridDim.x * (kThreads / 32);
  const int rows = *p.num_dispatched;
  const int E = p.experts_per_rank;
  const int vectors = p.hidden_size / 8;
  for (int i = blockIdx.x * (kThreads / 32) + threadIdx.x / 32; i < rows; i += warps) {
    const int32_t* targets = p.dense_to_expert_map + int64_t(i) * E;
    float4* dst = reinterpret_cast<float4*>(p.dense + int64_t(i) * p.hidden_size);
    for (int base = 0; base < vectors; base += 32 * kVectorsInFlight) {
      float acc[kVectorsInFlight][8] = {};
      for (int e0 = 0; e0 < E; e0 += 32) {
        const int32_t mine = e0 + lane < E ? targets[e0 + lane] : -1;
        const int span = min(32, E - e0);
        for (int e = 0; e < span; ++e) {  // ascending expert, as the reference adds them
          const int32_t r = __shfl_sync(0xffffffffu, mine, e);
          if (r < 0) continue;
          const uint4* src = reinterpret_cast<const uint4*>(p.hidden + int64_t(r) * p.hidden_size);
          uint4 v[kVectorsInFlight];
#pragma unroll
          for (int k = 0; k < kVectorsInFlight; ++k) {
            const int at = base + k * 32 + lane;
            if (at < vectors) v[k] = src[at];
          }
#pragma unroll
          for (int k = 0; k < kVectorsInFlight; ++k) {
            if (base + k * 32 + lane < vectors) accumulate(acc[k], v[k]);
          }
        }
      }
#pragma unroll
      for (int k = 0; k < kVectorsInFlight; ++k) {
        const int at = base + k * 32 + lane;
        if (at >= vectors) continue;
        dst[2 * at] = make_float4(acc[k][0], acc[k][1], acc[k][2], acc[k][3]);
        dst[2 * at + 1] = make_float4(acc[k][4], acc[k][5], acc[k][6], acc[k][7]);
      }
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

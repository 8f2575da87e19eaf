// Permute: the received rows (still in this rank's registered buffer) into the expert-major
// layout. A gather, one warp per output row: every output row is written exactly once (the
// row, or zeros for padding and for the tail past the data), so no memset pass is needed.
#include <algorithm>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/kernels/params.h"

namespace hybrid_ep {
namespace {

constexpr int kThreads = 256;

constexpr int kInFlight = 4;  // 16-byte loads per lane issued before their stores

// A warp copies one row, each lane kInFlight vectors at a time: the loads of a round are all in
// flight before its stores (one load at a time left a warp latency-bound, which shows when the
// kernel gets only a few SMs, e.g. an MPS share).
__device__ __forceinline__ void copy_row(uint4* __restrict__ dst, const uint4* __restrict__ src,
                                         int vectors, int lane) {
  for (int base = 0; base < vectors; base += 32 * kInFlight) {
    uint4 v[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const int at = base + k * 32 + lane;
      if (at < vectors) v[k] = src[at];
    }
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const int at = base + k * 32 + lane;
      if (at < vectors) dst[at] = v[k];
    }
  }
}

__global__ void __launch_bounds__(kThreads) permute_kernel(PermuteParams p) {
  const int lane = threadIdx.x % 32;
  const int warps = gridDim.x * (kThreads / 32);
  const int vectors = p.row_bytes / 16;
  for (int o = blockIdx.x * (kThreads / 32) + threadIdx.x / 32; o < p.num_permuted; o += warps) {
    const int source = p.row_source[o];
    const int64_t i = source >= 0 ? source / p.experts_per_rank : -1;
    uint4* dst = reinterpret_cast<uint4*>(p.out + int64_t(o) * p.row_bytes);
    if (i >= 0) {
      copy_row(dst, reinterpret_cast<const uint4*>(p.rows + i * p.row_bytes), vectors, lane);
    } else {
      for (int v = lane; v < vectors; v += 32) dst[v] = make_uint4(0, 0, 0, 0);
    }
    if (p.out_probs != nullptr && lane == 0) {
      const int e = source % p.experts_per_rank;
      p.out_probs[o] = i >= 0 ? p.probs[i * p.prob_cols + p.prob_col_offset + e] : 0.f;
    }
    if (p.out_scales != nullptr) {
      for (int c = lane; c < p.scale_cols; c += 32) {
        p.out_scales[int64_t(o) * p.scale_cols + c] = i >= 0 ? p.scales[i * p.scale_cols + c] : 0.f;
      }
    }
  }
}

}  // namespace

void launch_permute(const PermuteParams& p, int blocks, cudaStream_t stream) {
  if (p.num_permuted == 0) return;
  blocks = std::max(1, std::min(blocks, (p.num_permuted + kThreads / 32 - 1) / (kThreads / 32)));
  permute_kernel<<<blocks, kThreads, 0, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hybrid_ep

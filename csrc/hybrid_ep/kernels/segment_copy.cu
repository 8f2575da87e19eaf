// Copies of several byte ranges in one launch: every thread of the grid walks each range in
// turn with the widest vector that the range's addresses and length allow.
#include <algorithm>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/kernels/params.h"

namespace hybrid_ep {
namespace {

constexpr int kThreads = 512;
constexpr int kBlocksPerSm = 2;
// Loads each thread issues before their stores: a copy is bound by the bytes it keeps in
// flight. (Four blocks per SM, i.e. twice these bytes, measured no faster at 8 ranks.)
constexpr int kUnroll = 4;

template <typename V>
__device__ __forceinline__ void copy_vectors(const V* src, V* dst, size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    V v[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) v[k] = __ldcs(src + i + k * stride);
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) __stcs(dst + i + k * stride, v[k]);
  }
  for (; i < n; i += stride) __stcs(dst + i, __ldcs(src + i));
}

__device__ __forceinline__ bool aligned_to(const CopySegment& s, uintptr_t a) {
  return ((reinterpret_cast<uintptr_t>(s.src) | reinterpret_cast<uintptr_t>(s.dst) | s.bytes) %
          a) == 0;
}

__global__ void __launch_bounds__(kThreads) segment_copy_kernel(SegmentCopyParams p) {
  for (int k = 0; k < p.count; ++k) {
    const CopySegment s = p.segments[k];
    if (aligned_to(s, 16)) {
      copy_vectors(reinterpret_cast<const uint4*>(s.src), reinterpret_cast<uint4*>(s.dst),
                   s.bytes / 16);
    } else if (aligned_to(s, 4)) {
      copy_vectors(reinterpret_cast<const unsigned*>(s.src), reinterpret_cast<unsigned*>(s.dst),
                   s.bytes / 4);
    } else {
      copy_vectors(s.src, s.dst, s.bytes);
    }
  }
}

}  // namespace

void launch_segment_copy(const SegmentCopyParams& p, int sms, cudaStream_t stream) {
  size_t largest = 0;
  for (int k = 0; k < p.count; ++k) largest = std::max(largest, p.segments[k].bytes);
  if (largest == 0) return;
  const size_t per_block = size_t(kThreads) * kUnroll * 16;
  const int blocks =
      int(std::min<size_t>((largest + per_block - 1) / per_block, size_t(kBlocksPerSm) * sms));
  segment_copy_kernel<<<blocks, kThreads, 0, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hybrid_ep

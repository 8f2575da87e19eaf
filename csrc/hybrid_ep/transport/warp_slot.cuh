// The slot of the calling warp in a backend's per-warp array (doca's put batches, nixl's
// pending requests): one per warp of the launch, by block and warp index.
#pragma once

#include <cstdint>

namespace hybrid_ep {

// Null when the launch has more warps than `count` slots: the caller then posts at once.
template <typename T>
__device__ __forceinline__ T* warp_slot(T* slots, int count) {
  const uint64_t block =
      blockIdx.x + uint64_t(gridDim.x) * (blockIdx.y + uint64_t(gridDim.y) * blockIdx.z);
  const uint32_t thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const uint32_t warps = (blockDim.x * blockDim.y * blockDim.z + 31) / 32;
  const uint64_t slot = block * warps + thread / 32;
  return slot < uint64_t(count) ? slots + slot : nullptr;
}

}  // namespace hybrid_ep

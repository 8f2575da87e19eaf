// Host helpers for the small device arrays a backend keeps beside its counters (fault words,
// per-warp slots, view or peer tables): allocation zeroed, and the fault word's read.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "hybrid_ep/runtime/cuda_check.h"

namespace hybrid_ep {

// Zeroed device array [count]; free it with cudaFree. Throws CudaError.
template <typename T>
T* device_zeros(size_t count) {
  T* p = nullptr;
  HYBRID_EP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), sizeof(T) * count));
  HYBRID_EP_CUDA_CHECK(cudaMemset(p, 0, sizeof(T) * count));
  return p;
}

// A synchronous read of a device word of fault bits (the GPU cannot throw: it leaves bits).
inline unsigned int read_fault_bits(const unsigned int* device) {
  unsigned int bits = 0;
  HYBRID_EP_CUDA_CHECK(cudaMemcpy(&bits, device, sizeof(bits), cudaMemcpyDeviceToHost));
  return bits;
}

}  // namespace hybrid_ep

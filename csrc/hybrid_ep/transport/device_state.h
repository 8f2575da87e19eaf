// Host helpers for the small device arrays a backend keeps beside its counters (fault words,
// per-warp slots, view or peer tables): allocation zeroed, the fault word's read, and what a
// table of mapped peers means for the puts' sources.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "hybrid_ep/common/cuda_check.h"

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

// mapped[n]: where the peer of domain n is mapped into this process, or null. Puts to a mapped
// peer are our own stores, which read any device memory; any other peer's puts go through the
// library and read only registered memory.
inline bool some_peer_unmapped(const std::vector<uint8_t*>& mapped, int node_rank) {
  for (size_t n = 0; n < mapped.size(); ++n) {
    if (int(n) != node_rank && mapped[n] == nullptr) return true;
  }
  return false;
}

}  // namespace hybrid_ep

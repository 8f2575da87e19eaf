// Host helpers shared by the kernel launchers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <utility>

#include "hybrid_ep/common/cuda_check.h"

namespace hybrid_ep {

// Raises a kernel's dynamic shared-memory limit to `bytes` on the current device, once per
// (kernel, device) and size: the attribute persists, so later launches skip the driver call.
inline void allow_dynamic_smem(const void* kernel, size_t bytes) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, size_t> raised;
  int device = 0;
  HYBRID_EP_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  size_t& limit = raised[{kernel, device}];
  if (bytes <= limit) return;
  HYBRID_EP_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  limit = bytes;
}

}  // namespace hybrid_ep

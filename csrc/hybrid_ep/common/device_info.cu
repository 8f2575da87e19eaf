// A .cu file on purpose: the runtime is compiled by nvcc with the configured architectures
// from the first build on, so toolchain problems show up before the kernels arrive.
#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/common/device_info.h"

namespace hybrid_ep {

int device_count() noexcept {
  int count = 0;
  // No driver -> cudaErrorInsufficientDriver, no GPU -> cudaErrorNoDevice: both mean 0.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

int runtime_version() {
  int version = 0;
  HYBRID_EP_CUDA_CHECK(cudaRuntimeGetVersion(&version));
  return version;
}

int driver_version() noexcept {
  int version = 0;
  // Reports 0 (and success) when no driver is installed.
  if (cudaDriverGetVersion(&version) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return version;
}

int max_shared_memory_per_block() {
  int device = 0;
  int bytes = 0;
  HYBRID_EP_CUDA_CHECK(cudaGetDevice(&device));
  HYBRID_EP_CUDA_CHECK(
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return bytes;
}

int multiprocessor_count() {
  int device = 0;
  int sms = 0;
  HYBRID_EP_CUDA_CHECK(cudaGetDevice(&device));
  HYBRID_EP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

}  // namespace hybrid_ep

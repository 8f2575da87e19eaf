// Error handling for CUDA runtime calls: every failure becomes a C++ exception (translated to
// hybrid_ep._C.CudaError in Python) that says which call failed, why, and where.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace hybrid_ep {

class CudaError : public std::runtime_error {
 public:
  CudaError(cudaError_t code, const std::string& message)
      : std::runtime_error(message), code_(code) {}

  cudaError_t code() const noexcept { return code_; }

 private:
  cudaError_t code_;
};

namespace detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t code, const char* call, const char* file,
                                          int line) {
  // Clear the runtime's last-error slot: otherwise a later, unrelated
  // HYBRID_EP_CUDA_CHECK(cudaGetLastError()) would report this error a second time.
  // (Sticky errors stay; the next call reports them again, which is right.)
  (void)cudaGetLastError();
  throw CudaError(code, std::string(call) + " failed: " + cudaGetErrorName(code) + " (" +
                            cudaGetErrorString(code) + ") at " + file + ":" + std::to_string(line));
}

}  // namespace detail
}  // namespace hybrid_ep

#define HYBRID_EP_CUDA_CHECK(call)                                                              \
  do {                                                                                          \
    const cudaError_t hybrid_ep_cuda_status_ = (call);                                          \
    if (hybrid_ep_cuda_status_ != cudaSuccess) {                                                \
      ::hybrid_ep::detail::throw_cuda_error(hybrid_ep_cuda_status_, #call, __FILE__, __LINE__); \
    }                                                                                           \
  } while (0)

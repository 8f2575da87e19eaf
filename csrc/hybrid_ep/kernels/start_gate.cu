#include "hybrid_ep/kernels/common/ptx.cuh"
#include "hybrid_ep/kernels/start_gate.h"
#include "hybrid_ep/runtime/cuda_check.h"

namespace hybrid_ep {
namespace {

__global__ void read_gpu_time_kernel(uint64_t* now) { *now = ptx::global_timer_ns(); }

__global__ void start_gate_kernel(uint64_t target_ns) {
  while (ptx::global_timer_ns() < target_ns) __nanosleep(256);
}

}  // namespace

uint64_t gpu_time_ns(cudaStream_t stream) {
  uint64_t* now = nullptr;
  HYBRID_EP_CUDA_CHECK(cudaMallocHost(&now, sizeof(*now)));
  read_gpu_time_kernel<<<1, 1, 0, stream>>>(now);
  const cudaError_t launched = cudaGetLastError();
  const cudaError_t done = cudaStreamSynchronize(stream);
  const uint64_t value = *now;
  HYBRID_EP_CUDA_CHECK(cudaFreeHost(now));
  HYBRID_EP_CUDA_CHECK(launched);
  HYBRID_EP_CUDA_CHECK(done);
  return value;
}

void launch_start_gate(uint64_t target_ns, cudaStream_t stream) {
  start_gate_kernel<<<1, 1, 0, stream>>>(target_ns);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hybrid_ep

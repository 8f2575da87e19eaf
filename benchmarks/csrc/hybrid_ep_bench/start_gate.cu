#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/common/ptx.cuh"
#include "hybrid_ep_bench/start_gate.h"

namespace hybrid_ep {
namespace {

__global__ void read_gpu_time_kernel(uint64_t* now) { *now = ptx::global_timer_ns(); }

__global__ void start_gate_kernel(uint64_t target_ns) {
  while (ptx::global_timer_ns() < target_ns) __nanosleep(256);
}

}  // namespace

uint64_t gpu_time_ns(cudaStream_t stream) {
  // One pinned word for the process: the benchmark reads the timer before every gated call,
  // and a pinned allocation and free per read cost more than the read.
  static uint64_t* const now = [] {
    uint64_t* word = nullptr;
    HYBRID_EP_CUDA_CHECK(cudaMallocHost(&word, sizeof(*word)));
    return word;
  }();
  read_gpu_time_kernel<<<1, 1, 0, stream>>>(now);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
  HYBRID_EP_CUDA_CHECK(cudaStreamSynchronize(stream));
  return *now;
}

void launch_start_gate(uint64_t target_ns, cudaStream_t stream) {
  start_gate_kernel<<<1, 1, 0, stream>>>(target_ns);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hybrid_ep

// The benchmark's start gate: a stream waits on the GPU until the GPU's global timer reaches an
// instant that ranks sharing the GPU agreed on. That timer is one clock for every process on
// the GPU, so their next kernels start together however late each host enqueued them: kernel
// times then leave out the hosts' skew, which the API times keep.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace hybrid_ep {

// The GPU's global timer now (ns), read by a kernel on `stream` (synchronises it).
uint64_t gpu_time_ns(cudaStream_t stream);

// Holds `stream` until the GPU's global timer reaches `target_ns`.
void launch_start_gate(uint64_t target_ns, cudaStream_t stream);

}  // namespace hybrid_ep

// The probes' timer: seconds per launch, the best of three runs of `iters` launches back to
// back, after one warm-up launch.
#pragma once

#include <cuda_runtime.h>

#include "hybrid_ep/runtime/cuda_check.h"

template <class Launch>
double best_seconds(Launch launch, int iters) {
  cudaEvent_t start, stop;
  HYBRID_EP_CUDA_CHECK(cudaEventCreate(&start));
  HYBRID_EP_CUDA_CHECK(cudaEventCreate(&stop));
  launch();
  HYBRID_EP_CUDA_CHECK(cudaDeviceSynchronize());
  float best = 1e30f;
  for (int rep = 0; rep < 3; ++rep) {
    HYBRID_EP_CUDA_CHECK(cudaEventRecord(start));
    for (int i = 0; i < iters; ++i) launch();
    HYBRID_EP_CUDA_CHECK(cudaEventRecord(stop));
    HYBRID_EP_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms;
    HYBRID_EP_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    best = ms / iters < best ? ms / iters : best;
  }
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
  HYBRID_EP_CUDA_CHECK(cudaEventDestroy(start));
  HYBRID_EP_CUDA_CHECK(cudaEventDestroy(stop));
  return best * 1e-3;
}

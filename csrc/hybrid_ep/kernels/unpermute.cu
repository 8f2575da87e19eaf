// Unpermute: every dispatch row's expert outputs summed in fp32 (ascending expert, as the
// reference adds them) straight into the registered combine region, where the combine kernels
// of the domain pull them. One warp per dispatch row; the row count D is read on the device,
// so the launch needs no host synchronisation (non-blocking mode, CUDA graphs).
#include <algorithm>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/kernels/params.h"
#include "hybrid_ep/kernels/unpermute_row.cuh"

namespace hybrid_ep {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) unpermute_kernel(UnpermuteParams p) {
  const int lane = threadIdx.x % 32;
  const int warps = gridDim.x * (kThreads / 32);
  const int rows = *p.num_dispatched;
  for (int i = blockIdx.x * (kThreads / 32) + threadIdx.x / 32; i < rows; i += warps) {
    unpermute_row(p, i, lane);
  }
}

}  // namespace

void launch_unpermute(const UnpermuteParams& p, int blocks, cudaStream_t stream) {
  unpermute_kernel<<<std::max(blocks, 1), kThreads, 0, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hybrid_ep

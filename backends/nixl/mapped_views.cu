#include "mapped_views.h"
#include "ucx_device.cuh"

namespace hybrid_ep::nixl {
namespace {

__global__ void resolve_mapped_views_kernel(const ucp_device_remote_mem_list* const* views,
                                            int nodes, uint8_t** mapped) {
  for (int n = threadIdx.x; n < nodes; n += blockDim.x) {
    mapped[n] =
        views[n] != nullptr ? static_cast<uint8_t*>(ucx_device::mapped_base(views[n])) : nullptr;
  }
}

}  // namespace

void resolve_mapped_views(const ucp_device_remote_mem_list* const* views, int nodes,
                          uint8_t** mapped, cudaStream_t stream) {
  resolve_mapped_views_kernel<<<1, 32, 0, stream>>>(views, nodes, mapped);
}

}  // namespace hybrid_ep::nixl

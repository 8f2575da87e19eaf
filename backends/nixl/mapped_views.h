// Which peers' buffers UCX maps into this process: resolved once at connect, on the GPU,
// because the memory views (and ucp_device_get_ptr) live there.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

struct ucp_device_remote_mem_list;

namespace hybrid_ep::nixl {

// mapped[n] = element 0 of views[n] as a pointer this process can store to, or null where UCX
// has no such mapping (an RDMA lane) or views[n] is null (our own domain). Device arrays of
// `nodes`; enqueued on `stream`.
void resolve_mapped_views(const ucp_device_remote_mem_list* const* views, int nodes,
                          uint8_t** mapped, cudaStream_t stream);

}  // namespace hybrid_ep::nixl

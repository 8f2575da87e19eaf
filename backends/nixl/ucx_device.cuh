// Our small wrappers over UCX's device API (ucp/api/device/ucp_device_impl.h), called by all 32
// lanes of a warp with the same arguments: the warp-level ucp_device_* variants let every lane
// take part in the copy (cuda_ipc) or in building the work requests (GPU-direct-async).
// Element 0 of every view is the registered buffer, so offsets are offsets into it.
#pragma once

#include <ucp/api/device/ucp_device_impl.h>

#include <cstdint>

namespace hybrid_ep::ucx_device {

constexpr ucs_device_level_t kLevel = UCS_DEVICE_LEVEL_WARP;

// A put of `bytes` from `local_offset` of our buffer to `remote_offset` of the peer's. Without
// flags UCX may hold the doorbell back (coalescing the warp's puts); the next signal rings it.
// Returns UCS_OK (done), UCS_INPROGRESS (`request` tracks it) or an error.
__device__ __forceinline__ ucs_status_t put(const ucp_device_local_mem_list* local,
                                            const ucp_device_remote_mem_list* remote,
                                            uint64_t local_offset, uint64_t remote_offset,
                                            uint64_t bytes, unsigned channel,
                                            ucp_device_request_t* request) {
  return ucp_device_put<kLevel>(const_cast<ucp_device_local_mem_list*>(local), 0, local_offset,
                                const_cast<ucp_device_remote_mem_list*>(remote), 0, remote_offset,
                                bytes, channel, 0, request);
}

// Adds `value` to the 64-bit word at `offset` of the peer's buffer, after the earlier puts of
// the channel (cuda_ipc: a system-scope release fence then an atomic add, which the peer's
// acquire polls see; RDMA: an atomic on the same queue, executed in order). NODELAY: the
// signal and the puts held back before it leave now, a receiver is waiting for them.
__device__ __forceinline__ ucs_status_t counter_add(const ucp_device_remote_mem_list* remote,
                                                    uint64_t offset, uint64_t value,
                                                    unsigned channel) {
  return ucp_device_counter_inc<kLevel>(value, const_cast<ucp_device_remote_mem_list*>(remote), 0,
                                        offset, channel, UCP_DEVICE_FLAG_NODELAY, nullptr);
}

// The peer's element 0 as an address this process can store to (UCX maps it for a cuda_ipc
// lane), or null when its lane cannot be reached by loads and stores.
__device__ __forceinline__ void* mapped_base(const ucp_device_remote_mem_list* remote) {
  void* address = nullptr;
  const ucs_status_t status =
      ucp_device_get_ptr(const_cast<ucp_device_remote_mem_list*>(remote), 0, &address);
  return status == UCS_OK ? address : nullptr;
}

// One progress step of `request`: UCS_OK when done, UCS_INPROGRESS, or an error.
__device__ __forceinline__ ucs_status_t progress(ucp_device_request_t* request) {
  return ucp_device_progress_req<kLevel>(request);
}

}  // namespace hybrid_ep::ucx_device

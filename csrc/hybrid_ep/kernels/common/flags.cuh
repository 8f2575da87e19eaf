// Monotonic flags between ranks. Every flag advances exactly once per operation; its consumer
// keeps the expected value in its own device memory (so nothing is reset between calls and a
// captured CUDA graph stays correct on replay), and a wait gives up after a timeout.
#pragma once

#include <cstdint>

#include "hybrid_ep/kernels/common/ptx.cuh"
#include "hybrid_ep/kernels/common/status.h"

namespace hybrid_ep {

// Publishes earlier writes of this thread (generic and TMA) to other processes, then bumps
// `flag` on the receiving side.
__device__ __forceinline__ void signal_flag(uint64_t* flag) {
  ptx::fence_proxy_async_global();
  __threadfence_system();
  ptx::add_release_sys(flag, 1);
}

__device__ __forceinline__ void report_timeout(DeviceStatus* status, uint32_t* abort, WaitSite site,
                                               int peer, int slot, uint64_t expected,
                                               uint64_t seen) {
  atomicExch(abort, 1u);
  if (atomicCAS(&status->code, 0, static_cast<int32_t>(StatusCode::kTimeout)) == 0) {
    status->site = static_cast<int32_t>(site);
    status->peer = peer;
    status->slot = slot;
    status->expected = expected;
    status->seen = seen;
    __threadfence_system();
  }
}

// A peer's stamp of the call (`theirs`, read after the flag that published it) against this
// rank's: a difference stops the call before it moves data, like a failed wait, and says
// what differed. 0 is no stamp (internal operations) and agrees with anything.
__device__ __forceinline__ bool stamps_agree(uint64_t mine, uint64_t theirs, DeviceStatus* status,
                                             uint32_t* abort, WaitSite site, int peer) {
  if (mine == 0 || theirs == 0 || mine == theirs) return true;
  atomicExch(abort, 1u);
  if (atomicCAS(&status->code, 0, static_cast<int32_t>(StatusCode::kMismatch)) == 0) {
    status->site = static_cast<int32_t>(site);
    status->peer = peer;
    status->slot = 0;
    status->expected = mine;
    status->seen = theirs;
    __threadfence_system();
  }
  return false;
}

// Waits until *flag >= target. Returns false (after reporting) on timeout, or at once when
// another wait already failed (the abort word lives in device memory: cheap to poll, unlike
// the host-mapped status).
__device__ __forceinline__ bool wait_until(const uint64_t* flag, uint64_t target,
                                           uint64_t timeout_ns, DeviceStatus* status,
                                           uint32_t* abort, WaitSite site, int peer, int slot) {
  uint64_t seen = ptx::load_acquire_sys(flag);
  if (seen >= target) return true;
  const uint64_t start = ptx::global_timer_ns();
  while (true) {
    seen = ptx::load_acquire_sys(flag);
    if (seen >= target) return true;
    if (*static_cast<volatile uint32_t*>(abort) != 0) return false;
    if (ptx::global_timer_ns() - start > timeout_ns) {
      report_timeout(status, abort, site, peer, slot, target, seen);
      return false;
    }
    __nanosleep(64);
  }
}

// The single consumer's wait: advances its expected value, then waits until *flag reaches it.
__device__ __forceinline__ bool wait_flag(const uint64_t* flag, uint64_t* expected,
                                          uint64_t timeout_ns, DeviceStatus* status,
                                          uint32_t* abort, WaitSite site, int peer, int slot) {
  const uint64_t target = *expected + 1;
  *expected = target;
  return wait_until(flag, target, timeout_ns, status, abort, site, peer, slot);
}

}  // namespace hybrid_ep

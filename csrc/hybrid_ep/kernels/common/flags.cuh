// Monotonic flags between ranks. Every flag advances exactly once per operation; its consumer
// keeps the expected value in its own device memory (so nothing is reset between calls and a
// captured CUDA graph stays correct on replay), and a wait gives up after a timeout.
#pragma once

#include <cstdint>

#include "hybrid_ep/common/ptx.cuh"
#include "hybrid_ep/kernels/common/domain_view.h"

namespace hybrid_ep {

// Publishes earlier writes of this thread (generic and TMA) to other processes, then bumps
// `flag` on the receiving side.
__device__ __forceinline__ void signal_flag(uint64_t* flag) {
  ptx::fence_proxy_async_global();
  __threadfence_system();
  ptx::add_release_sys(flag, 1);
}

// A failed wait or stamp check: stops every later kernel of this rank (`bits` of the abort word)
// and, if it is the first failure, says where and during which call (the call's stamp).
__device__ __forceinline__ void report_failure(const DomainView& d, StatusCode code, WaitSite site,
                                               int peer, int slot, uint64_t expected, uint64_t seen,
                                               uint32_t bits = kAbortNow) {
  atomicOr(d.abort, bits);
  DeviceStatus* status = d.status;
  if (atomicCAS(&status->code, 0, static_cast<int32_t>(code)) == 0) {
    status->site = static_cast<int32_t>(site);
    status->peer = peer;
    status->slot = slot;
    status->expected = expected;
    status->seen = seen;
    status->stamp = d.stamp;
    __threadfence_system();
  }
}

// Waits until *flag >= target. Returns false (after reporting) on timeout, or at once when
// another wait already failed (the abort word lives in device memory: cheap to poll, unlike
// the host-mapped status).
__device__ __forceinline__ bool wait_until(const uint64_t* flag, uint64_t target,
                                           const DomainView& d, WaitSite site, int peer, int slot) {
  uint64_t seen = ptx::load_acquire_sys(flag);
  if (seen >= target) return true;
  const uint64_t start = ptx::global_timer_ns();
  while (true) {
    seen = ptx::load_acquire_sys(flag);
    if (seen >= target) return true;
    if (d.aborted()) return false;
    if (ptx::global_timer_ns() - start > d.timeout_ns) {
      report_failure(d, StatusCode::kTimeout, site, peer, slot, target, seen);
      return false;
    }
    __nanosleep(64);
  }
}

// The single consumer's wait: advances its expected value, then waits until *flag reaches it.
__device__ __forceinline__ bool wait_flag(const uint64_t* flag, uint64_t* expected,
                                          const DomainView& d, WaitSite site, int peer, int slot) {
  const uint64_t target = *expected + 1;
  *expected = target;
  return wait_until(flag, target, d, site, peer, slot);
}

// Slot of sender `index` in a [2][count] stamp region at `region`, for the exchange whose
// count (the consumer's target of the flag that publishes it) is `exchange`: a sender is at
// most one exchange ahead of its receiver, so its next stamp never lands on one not read yet.
__host__ __device__ __forceinline__ size_t stamp_slot(size_t region, int count, uint64_t exchange,
                                                      int index) {
  return region + sizeof(uint64_t) * (size_t(exchange & 1) * count + index);
}

// Set in a stamp a rank passes to the other domains when ranks of its own domain disagree.
constexpr uint64_t kDomainDisagrees = 1ull << 63;

// The stamp this rank passes to the peers of the other domains (after its domain's exchange).
__device__ __forceinline__ uint64_t stamp_for_network(const DomainView& d) {
  return d.stamp | (d.mismatch_seen() ? kDomainDisagrees : 0);
}

// A peer's stamp of the call (`theirs`, read after the flag that published it) against this
// rank's: a difference stops the call before it moves data, like a failed wait, and says what
// differed; during the exchange (`now` false) only once the exchange is done (settle()). 0 is
// no stamp (internal operations) and agrees with anything.
__device__ __forceinline__ bool stamps_agree(const DomainView& d, uint64_t theirs, WaitSite site,
                                             int peer, bool now = false) {
  if (d.stamp == 0 || theirs == 0 || d.stamp == theirs) return true;
  report_failure(d, StatusCode::kMismatch, site, peer, 0, d.stamp, theirs,
                 now ? kAbortNow | kMismatchSeen : kMismatchSeen);
  return false;
}

}  // namespace hybrid_ep

// The view of its NVLink domain every cross-rank kernel gets: where the peers' registered
// buffers are, this rank's consumer counters, and where a failed wait reports.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "hybrid_ep/common/status.h"

namespace hybrid_ep {

// Bits of the abort word. A stamp that differs (kMismatchSeen) does not stop the exchange that
// found it: the rank still passes its own stamp on (saying its domain disagrees), so that every
// rank learns of the mismatch, and the exchange's end turns it into kAbortNow (settle()).
constexpr uint32_t kAbortNow = 1;
constexpr uint32_t kMismatchSeen = 2;

// What every cross-rank kernel needs to find its domain and report a stuck wait.
struct DomainView {
  uint8_t* const* peers;  // device array [R]: base of each local rank's registered buffer
  int ranks;              // R
  int local_rank;         // this rank's index in the domain
  int node_rank;          // this domain's index
  int nodes;              // N
  int world;              // W = N * R
  uint64_t* expected;     // this rank's consumer counters, mirrors the registered flag region
  size_t flags_begin;     // offset of the flag region (expected[i] <-> flag at begin + 8 i)
  DeviceStatus* status;   // host-mapped
  uint32_t* abort;        // device memory, kAbortNow | kMismatchSeen: later kernels return
  uint64_t timeout_ns;
  // This call's stamp (hybrid_ep/call_stamp.py, Runtime::begin_call), which the call's first
  // exchange (routing all-gather, barrier) compares with the peers'; 0: none.
  uint64_t stamp;

  __device__ uint32_t abort_bits() const { return *static_cast<volatile uint32_t*>(abort); }
  __device__ bool aborted() const { return (abort_bits() & kAbortNow) != 0; }
  __device__ bool mismatch_seen() const { return (abort_bits() & kMismatchSeen) != 0; }
#ifdef __CUDACC__  // host code includes this view too, and has no atomics
  // At the end of a call's first exchange: a mismatch seen during it stops the call now.
  __device__ bool settle() const {
    const uint32_t bits = abort_bits();
    if ((bits & kMismatchSeen) != 0 && (bits & kAbortNow) == 0) atomicOr(abort, kAbortNow);
    return bits != 0;
  }
#endif

  __host__ __device__ uint8_t* peer(int j) const { return peers[j]; }
  __host__ __device__ uint8_t* self() const { return peers[local_rank]; }
  // The consumer counter that belongs to the flag at registered offset `flag_offset`.
  __device__ uint64_t* expected_for(size_t flag_offset) const {
    return expected + (flag_offset - flags_begin) / sizeof(uint64_t);
  }
};

}  // namespace hybrid_ep

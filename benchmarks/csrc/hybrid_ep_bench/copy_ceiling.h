// The per-SM TMA ceiling of the benchmark: a pure copy kernel with the traffic pattern of
// dispatch (fan-out: one row loaded, stored to k rows) or of combine (fan-in: k rows loaded,
// one stored), built like them (persistent, one CTA per SM, a shared-memory ring with full and
// empty mbarriers, TMA bulk loads and stores) and doing nothing else. The dispatch and combine
// kernels are compared against it (hybrid_ep_bench/gpubench/ceiling.py). Timing is the caller's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace hybrid_ep {

// Fan-out copies that may each go to their own buffer (another process's, through CUDA IPC).
constexpr int kMaxCopyDestinations = 8;

struct CopyCeilingParams {
  const uint8_t* src;  // fan-out: [rows, row_bytes]; fan-in: [rows * k, row_bytes]
  uint8_t* dst;        // fan-out: [rows * k, row_bytes]; fan-in: [rows, row_bytes]
  int64_t rows;        // fan-out: rows loaded; fan-in: rows stored
  int row_bytes;       // multiple of 16
  int k;               // copies per row (>= 1)
  bool fan_in;
  int stages;         // ring depth; >= loads per row * store_lanes * (in_flight + release_every)
  int in_flight;      // per store lane: groups whose shared-memory reads may be pending (0..7)
  int release_every;  // per store lane: groups between two waits for the reads (>= 1)
  int store_lanes;    // store threads (one per warp), group n to lane n % store_lanes (1..4)
  // Fan-out only, optional: copy j of row i goes to copy_dst[j] + i * row_bytes instead of
  // dst's row (j * rows + i); all k set, or none (k <= kMaxCopyDestinations then).
  uint8_t* copy_dst[kMaxCopyDestinations];
};

// Dynamic shared memory of a ring of `stages` rows.
size_t copy_ceiling_smem_bytes(int row_bytes, int stages);

// The shallowest ring with which the kernel cannot deadlock (loads = k for fan-in, else 1).
int copy_ceiling_min_stages(int loads, int store_lanes, int in_flight, int release_every);

// The deepest ring that fits this device's shared memory for rows of `row_bytes`.
int copy_ceiling_max_stages(int row_bytes);

// Launches `blocks` CTAs (one per SM) on `stream`. Throws std::invalid_argument for arguments
// the kernel cannot run with (alignment, a ring too shallow for the pattern) and CudaError on
// a failed launch.
void launch_copy_ceiling(const CopyCeilingParams& p, int blocks, cudaStream_t stream);

}  // namespace hybrid_ep

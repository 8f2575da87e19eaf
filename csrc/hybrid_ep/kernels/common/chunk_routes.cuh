// A chunk's routing rows staged in shared memory. Every warp role keeps its own copy, so the
// per-token path reads shared memory instead of paying a global-load latency per token, and
// roles run ahead of each other without synchronising.
#pragma once

#include <cstdint>

namespace hybrid_ep {

struct ChunkRoutes {
  int32_t* rows;  // [chunk, ranks]: row in each local rank, or -1
  int ranks;

  __device__ const int32_t* token(int k) const { return rows + k * ranks; }

  // Cooperative copy of tokens [first, last) of `map` ([tokens, ranks]) by `threads` threads
  // (thread index `thread`); the caller synchronises the role afterwards.
  __device__ void load(const int32_t* map, int first, int last, int thread, int threads) const {
    const int count = (last - first) * ranks;
    const int32_t* src = map + int64_t(first) * ranks;
    for (int i = thread; i < count; i += threads) rows[i] = src[i];
  }

  __device__ int copies(int k) const {
    int n = 0;
    for (int j = 0; j < ranks; ++j) n += token(k)[j] >= 0;
    return n;
  }
};

// The next chunk's routes, loaded into registers while a role works on the current chunk: a
// role whose warps share one ChunkRoutes synchronises at every chunk boundary, and loaded
// there, the routes' global-load latency stalled all of its warps at once. Up to kHeld entries
// per thread; a chunk with more (wide domains) loads the rest at the boundary.
struct HeldRoutes {
  static constexpr int kHeld = 4;
  int32_t v[kHeld] = {};
  const int32_t* src = nullptr;
  int count = 0;

  // Tokens [first, last) of `map` ([tokens, ranks]); entries thread, thread + threads, ...
  __device__ void fetch(const int32_t* map, int first, int last, int ranks, int thread,
                        int threads) {
    src = map + int64_t(first) * ranks;
    count = (last - first) * ranks;
#pragma unroll
    for (int r = 0; r < kHeld; ++r) {
      const int i = thread + r * threads;
      if (i < count) v[r] = src[i];
    }
  }

  // Nothing held (no chunk follows).
  __device__ void clear() { count = 0; }

  // Writes the fetched chunk into `to`; the caller synchronises the role afterwards.
  __device__ void put(const ChunkRoutes& to, int thread, int threads) const {
#pragma unroll
    for (int r = 0; r < kHeld; ++r) {
      const int i = thread + r * threads;
      if (i < count) to.rows[i] = v[r];
    }
    for (int i = thread + kHeld * threads; i < count; i += threads) to.rows[i] = src[i];
  }
};

}  // namespace hybrid_ep

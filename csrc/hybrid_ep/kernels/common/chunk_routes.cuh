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

}  // namespace hybrid_ep

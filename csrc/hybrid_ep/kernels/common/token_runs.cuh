// Maximal runs of consecutive tokens, built by a warp in parallel (never post from a
// single lane what the warp can build). Each 32-token window is one ballot; a lane
// that ends a run writes its descriptor, pairing itself with the run's start by counting the
// starts and ends before it, and a run that reaches the window's last lane stays open into
// the next window.
#pragma once

#include <cstdint>

namespace hybrid_ep {

struct TokenRun {
  int start;
  int length;
};

// Position of the n-th (0-based) set bit of `mask` (which has more than n set bits).
__device__ __forceinline__ int nth_set_bit(unsigned mask, int n) {
  for (int i = 0; i < n; ++i) mask &= mask - 1;
  return __ffs(mask) - 1;
}

// Writes the runs of tokens t in [first, last) with selected(t) to runs[0..count) in
// ascending order and returns count (every lane gets it). `runs` needs room for
// (last - first + 1) / 2 entries. Called by all 32 lanes.
template <class Selected>
__device__ int build_token_runs(const Selected& selected, int first, int last, TokenRun* runs,
                                int lane) {
  int count = 0;        // runs closed so far
  int open_start = -1;  // start of the run that continues into the current window, or -1
  for (int base = first; base < last; base += 32) {
    const int t = base + lane;
    const bool on = t < last && selected(t);
    const unsigned mask = __ballot_sync(0xffffffffu, on);
    const bool prev = lane > 0 ? (mask >> (lane - 1)) & 1u : open_start >= 0;
    const bool next = lane < 31 ? (mask >> (lane + 1)) & 1u : t + 1 < last && selected(t + 1);
    const unsigned starts = __ballot_sync(0xffffffffu, on && !prev);
    const unsigned ends = __ballot_sync(0xffffffffu, on && !next);
    const int carried = open_start >= 0 ? 1 : 0;
    if (on && !next) {
      const int i = __popc(ends & ((1u << lane) - 1u));  // runs this window closed before mine
      const int start = i < carried ? open_start : base + nth_set_bit(starts, i - carried);
      runs[count + i] = TokenRun{start, t - start + 1};
    }
    const bool continues = __shfl_sync(0xffffffffu, on && next, 31);
    if (continues) {
      if (starts != 0) open_start = base + 31 - __clz(starts);
    } else {
      open_start = -1;
    }
    count += __popc(ends);
  }
  __syncwarp();
  return count;
}

}  // namespace hybrid_ep

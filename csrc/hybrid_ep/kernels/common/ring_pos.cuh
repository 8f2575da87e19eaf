// A ring role's position: the stage of its next item and that stage's mbarrier phase parity,
// advanced without a division per item (on one issuing lane, per-item divisions and modulos
// were part of the instruction chains that bounded the dispatch on small rows).
#pragma once

#include <cstdint>

namespace hybrid_ep {

struct RingPos {
  int stage;
  uint32_t phase;

  // The position of absolute ring item `item`.
  __device__ static RingPos of(uint32_t item, int stages) {
    return {int(item % uint32_t(stages)), (item / uint32_t(stages)) & 1u};
  }
  // `step` items on (step < stages).
  __device__ void advance(int step, int stages) {
    stage += step;
    if (stage >= stages) {
      stage -= stages;
      phase ^= 1;
    }
  }
  // The position `step` items on (step < stages), this one left as it is.
  __device__ RingPos plus(int step, int stages) const {
    RingPos next = *this;
    next.advance(step, stages);
    return next;
  }
  // Any number of items on: a loop of whole rounds, for steps of about a round or two.
  __device__ void advance_far(uint32_t step, int stages) {
    for (; step >= uint32_t(stages); step -= uint32_t(stages)) phase ^= 1u;
    advance(int(step), stages);
  }
};

// Items are dealt round-robin to `warps` consumers: how far from absolute item `item` the next
// item of consumer `w` is.
__device__ __forceinline__ int to_own_item(uint32_t item, int w, int warps) {
  return (w + warps - int(item % uint32_t(warps))) % warps;
}

}  // namespace hybrid_ep

// The eager form's epoch (memory/layout.h eager_epoch): how many kernels of one operation this
// rank ran before the running one, the same count on every rank (every rank runs every call),
// kept on the device so that a replayed CUDA graph still counts. The tiles' signal values
// derive from it and the chunk (eager_signal_value), so no slot is ever reset. Every block
// reads it once at its start; the last block to have read it advances it, so every block of
// one kernel sees one value and the next kernel (stream order) the next.
#pragma once

#include <cstdint>

namespace hybrid_ep {

struct EagerEpoch {
  uint64_t* words;  // [0]: the epoch, [1]: blocks of the running kernel that have read it

  // Thread 0 of every block of the kernel (`blocks` in all), once: returns the epoch.
  __device__ uint64_t take(int blocks) const {
    const uint64_t epoch = *reinterpret_cast<volatile uint64_t*>(&words[0]);
    __threadfence();
    if (atomicAdd(reinterpret_cast<unsigned long long*>(&words[1]), 1ull) ==
        static_cast<unsigned long long>(blocks - 1)) {
      words[1] = 0;
      words[0] = epoch + 1;
      __threadfence();
    }
    return epoch;
  }
};

}  // namespace hybrid_ep

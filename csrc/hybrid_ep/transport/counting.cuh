// The device side of the per-channel counters (counters.h): lane 0 of the calling warp counts
// one put and its bytes per put call, one signal per signal call, the same in every backend,
// so that transport_stats() means one thing whatever the build.
#pragma once

#include <cstddef>
#include <cstdint>

#include "hybrid_ep/transport/counters.h"

namespace hybrid_ep {

__device__ __forceinline__ void count_put(ChannelCounters* counters, int channel, size_t bytes,
                                          int lane) {
  if (lane == 0) {
    atomicAdd(&counters[channel].puts, 1ull);
    atomicAdd(&counters[channel].bytes, static_cast<unsigned long long>(bytes));
  }
}

__device__ __forceinline__ void count_eager_tiles(ChannelCounters* counters, int channel,
                                                  int64_t tiles, int lane) {
  if (lane == 0) {
    atomicAdd(&counters[channel].eager_tiles, static_cast<unsigned long long>(tiles));
  }
}

__device__ __forceinline__ void count_signal(ChannelCounters* counters, int channel, int lane) {
  if (lane == 0) atomicAdd(&counters[channel].signals, 1ull);
}

}  // namespace hybrid_ep

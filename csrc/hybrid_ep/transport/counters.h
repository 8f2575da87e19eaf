// Per-channel counters every transport keeps on the device (what transport_stats() reports),
// and the host side every backend shares: their allocation, read and reset.
#pragma once

#include <vector>

namespace hybrid_ep {

struct ChannelCounters {
  unsigned long long puts;
  unsigned long long signals;
  unsigned long long bytes;
  // Tiles of the eager form's puts (memory/eager_tiles.h): each carries its own signal, so
  // they are counted apart from puts (one per chunk payload) and signals (none).
  unsigned long long eager_tiles;
};

// Zeroed device array [channels]; free it with cudaFree. Throws CudaError.
ChannelCounters* allocate_counters(int channels);
// A synchronous read of the device array [channels].
std::vector<ChannelCounters> read_counters(const ChannelCounters* device, int channels);
void zero_counters(ChannelCounters* device, int channels);

}  // namespace hybrid_ep

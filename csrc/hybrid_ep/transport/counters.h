// Per-channel counters every transport keeps on the device (what transport_stats() reports).
#pragma once

namespace hybrid_ep {

struct ChannelCounters {
  unsigned long long puts;
  unsigned long long signals;
  unsigned long long bytes;
};

}  // namespace hybrid_ep

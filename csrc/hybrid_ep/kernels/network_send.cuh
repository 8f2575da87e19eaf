// The network warp's send of one chunk to one destination domain (docs/multi-domain.md): one
// put per maximal run of consecutive tokens per tensor, into the peer's receive tiles (which
// mirror the token index space, so a run is contiguous at both ends), then exactly one signal
// -- also for a chunk with no token for that domain, so the receiver never waits forever.
#pragma once

#include <cstdint>

#include "hybrid_ep/kernels/common/token_runs.cuh"
#include "hybrid_ep/transport/transport_device.cuh"

namespace hybrid_ep {

// A tensor the network leg carries: token t's `width` bytes at src + t * width locally and at
// remote + t * width (a registered-buffer offset) at the peer.
struct NetTensor {
  const uint8_t* src;
  size_t remote;
  int width;               // 0: not sent
  bool per_token = false;  // one put per token instead of per run (HYBRID_EP_PROB_PUTS=token)
};

constexpr int kMaxNetTensors = 3;  // rows, probs (restriped), FP8 scales

// Called by all lanes of one warp; `runs` is that warp's scratch (see build_token_runs). With
// `stored` the data is in the peer already (the kernel stored it into the mapped peer): the
// runs are only counted as the puts they stand for, then signalled.
template <class Selected>
__device__ void send_chunk(const TransportContext& ctx, int channel, int node,
                           const Selected& selected, int first, int last,
                           const NetTensor (&tensors)[kMaxNetTensors], size_t flag_offset,
                           TokenRun* runs, int lane, bool stored = false) {
  const int count = build_token_runs(selected, first, last, runs, lane);
  for (int r = 0; r < count; ++r) {
    const TokenRun run = runs[r];
#pragma unroll
    for (int k = 0; k < kMaxNetTensors; ++k) {
      const NetTensor& x = tensors[k];
      if (x.width == 0) continue;
      const size_t at = size_t(run.start) * x.width;
      const size_t bytes = size_t(run.length) * x.width;
      if (stored) {
        TransportDevice::count_stored(ctx, channel, bytes, lane);
      } else if (x.per_token) {
        for (int t = 0; t < run.length; ++t) {
          const size_t one = at + size_t(t) * x.width;
          TransportDevice::put(ctx, channel, node, x.remote + one, x.src + one, x.width, lane);
        }
      } else {
        TransportDevice::put(ctx, channel, node, x.remote + at, x.src + at, bytes, lane);
      }
    }
  }
  TransportDevice::signal(ctx, channel, node, flag_offset, 1, lane);
}

}  // namespace hybrid_ep

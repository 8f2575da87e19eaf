// When the bytes of an eager put (memory/eager_tiles.h) count as delivered at the
// receiver: at once on a real network, where a tile is there once its signal is; under the
// p2p build's emulated wire (backends/p2p/wire_model.cuh) at the instant its NIC would have
// carried them, which the sender writes into each tile's signal (EagerSignal::visible_ns).
#pragma once

#include <cuda_runtime_api.h>  // __host__ __device__ for the host compiler

#include <cstdint>

namespace hybrid_ep {

struct EagerDelivery {
  uint64_t start_ns = 0;  // global-timer instant the put started on its rail; 0: not emulated
  uint64_t op_ns = 0;
  uint64_t fs_per_byte = 0;
  uint64_t latency_ns = 0;

  // The instant the put's bytes up to `end` (from the payload's first wire byte) are
  // delivered; 0 when delivery is not emulated.
  __host__ __device__ uint64_t at(int64_t end) const {
    if (start_ns == 0) return 0;
    return start_ns + op_ns + uint64_t(end) * fs_per_byte / 1000000ull + latency_ns;
  }
};

}  // namespace hybrid_ep

// The dispatch loader's side of the eager form (memory/eager_tiles.h, network_send_eager.cuh):
// a peer's chunk sits in its slot as one record per token the chunk routes to this domain, in
// token order, in tiles that each end in a signal. The loader waits only for the tiles of the
// record it loads next, so a row is forwarded as soon as its own tiles have landed.
#pragma once

#include <cstdint>

#include "hybrid_ep/common/ptx.cuh"
#include "hybrid_ep/kernels/common/domain_view.h"
#include "hybrid_ep/kernels/common/eager_wait.cuh"
#include "hybrid_ep/kernels/common/flags.cuh"
#include "hybrid_ep/kernels/common/ring.cuh"
#include "hybrid_ep/memory/eager_tiles.h"

namespace hybrid_ep {

// The loader warp, one chunk: every lane holds the same reader (lane 0 issues the loads).
struct EagerReader {
  const uint8_t* slot;
  EagerPayload payload;
  int64_t bytes;
  uint64_t value;      // the signal its tiles carry this call
  int64_t landed = 0;  // tiles seen with it

  __device__ static EagerReader of(const uint8_t* slot, int records, int row_bytes, int prob_bytes,
                                   int scale_bytes, uint64_t value) {
    EagerReader r{slot, EagerPayload::make(records, row_bytes, prob_bytes, scale_bytes)};
    r.bytes = r.payload.bytes();
    r.value = value;
    return r;
  }

  // All lanes: waits until every tile record `k` takes has landed (wait_tiles). False after a
  // timeout (reported as a wait for chunk c from domain `node`).
  __device__ bool wait_record(int64_t k, const DomainView& d, int node, int c, int lane) {
    const int64_t last = EagerTiles::last_tile(payload.row_at(k) + payload.record);
    if (!wait_tiles(EagerSlot{slot, bytes, value}, landed, last, d, WaitSite::kNetworkFlag, node, c,
                    lane)) {
      return false;
    }
    __syncwarp();                                    // the lanes' acquires, before lane 0's loads
    if (lane == 0) ptx::fence_proxy_async_global();  // the TMA loads read what they saw
    return true;
  }

  // Record k (whole, its padding included) into `stage` at offset 0, one TMA load per tile it
  // spans; the caller expects payload.record bytes.
  __device__ void load(const Ring& ring, int stage, int64_t k) const {
    const int64_t begin = payload.row_at(k), end = begin + payload.record;
    for (int64_t b = begin; b < end;) {
      const int64_t piece = EagerTiles::piece(b, end);
      ring.load(stage, uint32_t(b - begin), slot + EagerTiles::wire_offset(b), uint32_t(piece));
      b += piece;
    }
  }
};

}  // namespace hybrid_ep

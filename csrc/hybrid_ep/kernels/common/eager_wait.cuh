// The receiver's wait for the tiles of an eager payload (memory/eager_tiles.h) in its slot,
// shared by the dispatch's loader (dispatch_eager.cuh) and the combine's final pass
// (combine_eager.cuh): a tile is in once its signal holds the chunk's value and, under the
// p2p build's emulated wire, its delivery instant has passed.
#pragma once

#include <cstdint>

#include "hybrid_ep/common/ptx.cuh"
#include "hybrid_ep/kernels/common/domain_view.h"
#include "hybrid_ep/kernels/common/flags.cuh"
#include "hybrid_ep/memory/eager_tiles.h"

namespace hybrid_ep {

// One chunk's payload in a receive slot.
struct EagerSlot {
  const uint8_t* slot;
  int64_t bytes;   // payload bytes
  uint64_t value;  // the signal its tiles carry this call

  __device__ const EagerSignal* signal(int64_t t) const {
    return reinterpret_cast<const EagerSignal*>(slot + EagerTiles::signal_at(bytes, t));
  }
};

// All lanes of a warp, with the same `landed` (the tiles seen in order so far): waits until
// tile `last` is in, advancing `landed` past it. The lanes look at the next 32 tiles at once, so
// that the tiles a later wait needs are mostly seen already: one lane polling tile after tile
// had put an acquire load's latency per tile into the dispatch loader's chain (2 x 2, 4096
// tokens: 2619 -> 1883 us under the wire, benchmarks/results/2026-12-03-eager-form.md). False
// after a timeout (reported at `site` as a wait for chunk c from domain `node`) or an abort.
// The caller orders what it reads next after the lanes' acquire loads.
__device__ __forceinline__ bool wait_tiles(const EagerSlot& e, int64_t& landed, int64_t last,
                                           const DomainView& d, WaitSite site, int node, int c,
                                           int lane) {
  const int64_t tiles = EagerTiles::count(e.bytes);
  uint64_t start = ptx::global_timer_ns();
  while (landed <= last) {
    const int64_t t = landed + lane;
    uint64_t seen = e.value;  // past the payload: nothing to wait for
    bool here = true;
    if (t < tiles) {
      const EagerSignal* signal = e.signal(t);
      seen = ptx::load_acquire_sys(&signal->value);
      here =
          seen == e.value && ptx::global_timer_ns() >=
                                 *reinterpret_cast<const volatile uint64_t*>(&signal->visible_ns);
    }
    const uint32_t in = __ballot_sync(~0u, here);
    const int run = in == ~0u ? 32 : __ffs(~in) - 1;  // the tiles seen in order
    landed += run;
    if (landed > last) break;
    if (d.aborted()) return false;
    const uint64_t now = ptx::global_timer_ns();
    if (run > 0) {
      start = now;  // the limit bounds a wait that sees nothing land
    } else if (now - start > d.timeout_ns) {
      const uint64_t first = __shfl_sync(~0u, seen, 0);  // lane 0 looked at the first missing
      if (lane == 0) report_failure(d, StatusCode::kTimeout, site, node, c, e.value, first);
      return false;
    }
    __nanosleep(64);
  }
  return true;
}

}  // namespace hybrid_ep

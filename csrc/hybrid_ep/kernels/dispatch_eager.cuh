// The dispatch loader's side of the eager form (memory/eager_tiles.h, network_send_eager.cuh):
// a peer's chunk sits in its slot as one record per token the chunk routes to this domain, in
// token order, in tiles that each end in a signal. The loader waits only for the tiles of the
// record it loads next, so a row is forwarded as soon as its own tiles have landed.
#pragma once

#include <cstdint>

#include "hybrid_ep/common/ptx.cuh"
#include "hybrid_ep/kernels/common/domain_view.h"
#include "hybrid_ep/kernels/common/flags.cuh"
#include "hybrid_ep/kernels/common/ring.cuh"
#include "hybrid_ep/memory/eager_tiles.h"

namespace hybrid_ep {

// Lane 0 of the loader, one chunk.
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

  // Waits until every tile record `k` takes has landed: its signal holds this call's value and
  // (emulated wire) its delivery instant has passed. False after a timeout (reported as a wait
  // for chunk c from domain `node`).
  __device__ bool wait_record(int64_t k, const DomainView& d, int node, int c) {
    const int64_t last = EagerTiles::last_tile(payload.row_at(k) + payload.record);
    for (; landed <= last; ++landed) {
      const EagerSignal* signal = reinterpret_cast<const EagerSignal*>(
          slot + landed * EagerTiles::kTileBytes + EagerTiles::signal_offset(bytes, landed));
      if (!wait_tile(signal, d, node, c)) return false;
    }
    ptx::fence_proxy_async_global();  // the TMA loads that follow read what the acquire saw
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

 private:
  __device__ bool wait_tile(const EagerSignal* signal, const DomainView& d, int node, int c) const {
    const uint64_t start = ptx::global_timer_ns();
    while (true) {
      const uint64_t seen = ptx::load_acquire_sys(&signal->value);
      if (seen == value) {
        const uint64_t visible = *reinterpret_cast<const volatile uint64_t*>(&signal->visible_ns);
        while (ptx::global_timer_ns() < visible) {
        }
        return true;
      }
      if (d.aborted()) return false;
      if (ptx::global_timer_ns() - start > d.timeout_ns) {
        report_failure(d, StatusCode::kTimeout, WaitSite::kNetworkFlag, node, c, value, seen);
        return false;
      }
      __nanosleep(64);
    }
  }
};

}  // namespace hybrid_ep

// The eager form of the dispatch's send of one chunk to one other domain (memory/eager_tiles.h,
// docs/multi-domain.md "Eager form"): the records of the chunk's tokens for that domain (row,
// probs, FP8 scales) go straight into the peer's slot in the tile layout, and each tile's
// signal is released after its data. No signal follows the chunk, and a chunk with no token
// for the domain sends nothing at all: its receiver counts the records from the routing it
// gathered and waits for none. Only to a mapped peer (the host enables the form for builds
// whose peers are: the p2p emulation).
#pragma once

#include <cstdint>

#include "hybrid_ep/common/ptx.cuh"
#include "hybrid_ep/memory/eager_tiles.h"
#include "hybrid_ep/transport/transport_device.cuh"
#include "hybrid_ep/transport/warp_copy.cuh"

namespace hybrid_ep {

// Token t's parts, each at its source + t * its width (width 0: not sent).
struct EagerSources {
  const uint8_t* rows;
  const uint8_t* probs;
  const uint8_t* scales;
  int row_bytes, prob_bytes, scale_bytes;
};

// A chunk's tile layout at the peer, while a warp writes it.
struct EagerWriter {
  uint8_t* slot;  // the peer's slot, mapped
  EagerPayload payload;
  int64_t bytes;  // payload bytes
  EagerDelivery due;

  // All lanes: payload bytes [at, at + n) from `src`, split where tiles end.
  __device__ void store(int64_t at, const uint8_t* src, int64_t n, int lane) const {
    for (int64_t b = at, end = at + n; b < end;) {
      const int64_t piece = EagerTiles::piece(b, end);
      warp_copy(slot + EagerTiles::wire_offset(b), src + (b - at), size_t(piece), lane);
      b += piece;
    }
  }

  // All lanes: releases the signals of tiles from, from + step, ... (< to), whose data the
  // warp has stored: the warp's stores, then lane 0's one release fence and the signals' stores
  // (a release pattern). A sequentially consistent system fence per record
  // (__threadfence_system) had tripled the dispatch at 2 x 2 (run s19d).
  __device__ void release(int64_t from, int64_t to, int64_t step, uint64_t value, int lane) const {
    if (from >= to) return;
    __syncwarp();
    if (lane == 0) {
      ptx::fence_acq_rel_sys();
      for (int64_t t = from; t < to; t += step) {
        const int64_t at = EagerTiles::signal_at(bytes, t);
        EagerSignal* signal = reinterpret_cast<EagerSignal*>(slot + at);
        // One store: a receiver that sees the value sees the instant written with it (the
        // tile's delivery, with its signal's last byte).
        ptx::store_pair_relaxed_sys(&signal->value, value, due.at(at + EagerTiles::kSignalBytes));
      }
    }
    __syncwarp();
  }
};

// The warps that send one chunk together, each its share of the tiles: a warp sending a chunk
// alone waited out each of its release fences while the block's other network warps idled
// (2 x 2, 256 tokens: 790 -> 416 us, run s20a).
struct EagerCrew {
  int warp, warps;        // this warp's index among them, how many
  uint32_t barrier;       // their named barrier
  EagerDelivery* shared;  // shared memory: the put's delivery, posted once by warp 0

  __device__ void sync() const { ptx::named_barrier(barrier, 32 * uint32_t(warps)); }
};

// A warp copies one tile's data per round, 8 vectors in flight per lane (two tiles' 16 made the
// dispatch kernel spill), and releases the signals of each four of its tiles at a time: each
// release fence waits for the warp's stores to land (four measured 3-4 % faster than two, run
// s20a).
constexpr int kEagerVectorsPerTile = int(EagerTiles::kDataBytes / 16);  // 255
constexpr int kEagerVectorsPerLane = (kEagerVectorsPerTile + 31) / 32;
constexpr int kEagerTilesPerRelease = 4;

// All lanes: the data of tile `tile` gathered from the records' tokens (`tokens[k]` is record
// k's), when every part is whole 16-byte vectors at 16-byte aligned sources: a copy per part
// had left each record's few pieces waiting on their loads one after another (2 x 2, 256
// tokens: 576 us against 364 signalled, run s19f).
__device__ __forceinline__ void copy_tile(const EagerWriter& w, int64_t tile_index,
                                          const int* tokens, const EagerSources& src, int lane) {
  // 32-bit offsets (a chunk's payload is far below 2 GiB): 64-bit ones spilled registers.
  const int record_bytes = int(w.payload.record), row_bytes = src.row_bytes;
  const int probs_at = int(w.payload.probs_at), scales_at = int(w.payload.scales_at);
  const int bytes = int(w.bytes), tile = int(tile_index);
  uint4 v[kEagerVectorsPerLane];
  uint32_t loaded = 0;  // bit u: vector u holds data (not padding, not past the payload)
#pragma unroll
  for (int u = 0; u < kEagerVectorsPerLane; ++u) {
    const int j = u * 32 + lane;
    const int b = tile * int(EagerTiles::kDataBytes) + j * 16;
    if (j >= kEagerVectorsPerTile || b >= bytes) continue;
    const int record = b / record_bytes, o = b - record * record_bytes;
    const int64_t t = tokens[record];
    const uint8_t* at = nullptr;
    if (o < row_bytes) {
      at = src.rows + t * row_bytes + o;
    } else if (o >= probs_at && o < probs_at + src.prob_bytes) {
      at = src.probs + t * src.prob_bytes + (o - probs_at);
    } else if (o >= scales_at && o < scales_at + src.scale_bytes) {
      at = src.scales + t * src.scale_bytes + (o - scales_at);
    }  // else padding between parts: not sent
    if (at != nullptr) {
      v[u] = *reinterpret_cast<const uint4*>(at);
      loaded |= 1u << u;
    }
  }
#pragma unroll
  for (int u = 0; u < kEagerVectorsPerLane; ++u) {
    if (((loaded >> u) & 1u) == 0) continue;
    *reinterpret_cast<uint4*>(w.slot + int64_t(tile) * EagerTiles::kTileBytes +
                              (u * 32 + lane) * 16) = v[u];
  }
}

// Parts of other widths (rare shapes), one warp: each record's parts by the warp's copy (bytes
// where unaligned), the tiles released as records complete them.
__device__ __forceinline__ void write_records(const EagerWriter& w, int records, int64_t tiles,
                                              const int* tokens, const EagerSources& src,
                                              uint64_t value, int lane) {
  int64_t released = 0;
  for (int record = 0; record < records; ++record) {
    const int64_t at = w.payload.row_at(record), t = tokens[record];
    w.store(at, src.rows + t * src.row_bytes, src.row_bytes, lane);
    if (src.prob_bytes > 0) {
      w.store(at + w.payload.probs_at, src.probs + t * src.prob_bytes, src.prob_bytes, lane);
    }
    if (src.scale_bytes > 0) {
      w.store(at + w.payload.scales_at, src.scales + t * src.scale_bytes, src.scale_bytes, lane);
    }
    // Tiles before the one the next record starts in are complete.
    const int64_t complete =
        record + 1 == records ? tiles : EagerTiles::first_tile(w.payload.row_at(record + 1));
    w.release(released, complete, 1, value, lane);
    released = complete;
  }
}

// Where a chunk's tiles go: the peer's slot where it is mapped; else this rank's staging slot,
// which one put carries to `remote` (the peer's slot, a registered-buffer offset) at `node`.
struct EagerTarget {
  uint8_t* slot;
  bool staged;
  int node;
  size_t remote;
};

// Called by all lanes of every warp of `crew` with the same arguments but `scratch`, each
// warp's own, at least last - first ints (its runs scratch, build_token_runs). `value` is the
// tiles' signal (eager_signal_value of the call's epoch and chunk).
template <class Selected>
__device__ void send_chunk_eager(const TransportContext& ctx, int channel,
                                 const EagerTarget& target, const Selected& selected, int first,
                                 int last, const EagerSources& src, uint64_t value, int* scratch,
                                 const EagerCrew& crew, int lane) {
  // Record k is the chunk's k-th token for the domain (each warp lists them).
  int records = 0;
  for (int base = first; base < last; base += 32) {
    const int t = base + lane;
    const bool on = t < last && selected(t);
    const unsigned mask = __ballot_sync(~0u, on);
    if (on) scratch[records + __popc(mask & ((1u << lane) - 1u))] = t;
    records += __popc(mask);
  }
  __syncwarp();
  if (records == 0) return;
  EagerWriter w{target.slot,
                EagerPayload::make(records, src.row_bytes, src.prob_bytes, src.scale_bytes)};
  w.bytes = w.payload.bytes();
  const int64_t tiles = EagerTiles::count(w.bytes);
  // One put: warp 0 posts it, the others read its delivery (the second barrier keeps the
  // shared word until all have). Staged, it is posted once the slot is written (below).
  if (crew.warp == 0 && !target.staged) {
    const EagerDelivery due = TransportDevice::count_eager_stored(
        ctx, channel, size_t(EagerTiles::wire_bytes(w.bytes)), tiles, lane);
    if (lane == 0) *crew.shared = due;
  }
  crew.sync();
  w.due = target.staged ? EagerDelivery{} : *crew.shared;
  crew.sync();
  const bool vectors =
      ((src.row_bytes | src.prob_bytes | src.scale_bytes) & 15) == 0 &&
      ((reinterpret_cast<uintptr_t>(src.rows) | reinterpret_cast<uintptr_t>(src.probs) |
        reinterpret_cast<uintptr_t>(src.scales)) &
       15) == 0;
  if (vectors) {  // warp k copies tiles k, k + warps, ...
    const int64_t step = crew.warps;
    int64_t pending = crew.warp;  // its first tile not yet released
    int held = 0;
    for (int64_t t = crew.warp; t < tiles; t += step) {
      copy_tile(w, t, scratch, src, lane);
      if (++held == kEagerTilesPerRelease || t + step >= tiles) {
        w.release(pending, t + 1, step, value, lane);
        pending = t + step;
        held = 0;
      }
    }
  } else if (crew.warp == 0) {
    write_records(w, records, tiles, scratch, src, value, lane);
  }
  if (target.staged) {
    crew.sync();  // every warp's tiles are in the staging slot
    if (crew.warp == 0) {
      TransportDevice::put_eager(ctx, channel, target.node, target.remote, target.slot, w.bytes,
                                 lane);
    }
  }
}

}  // namespace hybrid_ep

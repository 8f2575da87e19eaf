// The combine's eager form between domains (HYBRID_EP_EAGER; memory/eager_tiles.h,
// docs/multi-domain.md "Eager form"). The partials of
// another domain's chunk c go into that domain's peer as one record per token that came here
// (its partial at the wire's width, then its probs), in token order, in the tile layout of slot
// c % K of this domain's ring there; no signal follows the chunk, each tile carries its own.
//   reduce warps  (combine.cu): write each token's partial and probs straight into its record
//                  (PartialTarget, tiled), split where tiles end; towards a peer that is not
//                  mapped, into this rank's staging slot for it;
//   network warps (send_eager_partials): once the chunk is reduced, count the one put and
//                  release every tile's signal, with the instant the wire delivers it; staged,
//                  write the signals into the slot and put it (TransportDevice::put_eager);
//   final pass    (EagerPartials): the loader waits, token by token, for the tiles of the
//                  records it loads next, so it starts on a chunk before all of it has landed.
// A chunk with no token for a domain sends nothing; its receiver counts the records from the
// maps it holds and waits for none.
#pragma once

#include <cstdint>

#include "hybrid_ep/common/ptx.cuh"
#include "hybrid_ep/kernels/combine_ring.cuh"
#include "hybrid_ep/kernels/combine_walk.cuh"
#include "hybrid_ep/kernels/common/chunk_routes.cuh"
#include "hybrid_ep/kernels/common/domains.cuh"
#include "hybrid_ep/kernels/common/eager_wait.cuh"
#include "hybrid_ep/kernels/common/ring.cuh"
#include "hybrid_ep/memory/eager_tiles.h"
#include "hybrid_ep/transport/transport_device.cuh"

namespace hybrid_ep {
namespace combine {

// The payload of `records` tokens' partials (and their probs, when the call has them).
__device__ __forceinline__ EagerPayload eager_partials(const CombineParams& p, int records) {
  return EagerPayload::make(records, int64_t(partial_row_bytes(p)),
                            p.across.partial_probs != nullptr ? int64_t(p.prob_cols) * 4 : 0, 0);
}

// The slot of chunk c from the `other`-th other domain in the ring of net_partials at `ring`.
__device__ __forceinline__ int64_t eager_slot_offset(const CombineParams& p, int other, int c) {
  const CombineAcross& a = p.across;
  return (int64_t(other) * a.ring_chunks + c % a.ring_chunks) * a.eager_slot_bytes;
}
template <class Byte>
__device__ __forceinline__ Byte* eager_slot(const CombineParams& p, Byte* ring, int other, int c) {
  return ring + eager_slot_offset(p, other, c);
}

// This rank's staging slot of chunk c for domain `node` (not mapped): its ring is by
// destination, where the receiver's ring is by sender, so concurrent sends to several domains
// never share a slot.
__device__ __forceinline__ uint8_t* eager_staging_slot(const CombineParams& p, int node, int c) {
  const DomainView& d = p.domain;
  return eager_slot(p, d.self() + p.across.eager_staging, other_domain_index(node, d.node_rank), c);
}

// Warp 0 of the reduce warps, first pass: records[k] is token k's record in its chunk's slot
// (the tokens with a copy here, in order), -1 for the others, of the chunk's `tokens`.
__device__ __forceinline__ void number_records(int32_t* records, const ChunkRoutes& routes,
                                               int tokens, int lane) {
  int before = 0;
  for (int base = 0; base < tokens; base += 32) {
    const int k = base + lane;
    const bool came = k < tokens && routes.copies(k) > 0;
    const uint32_t mask = __ballot_sync(~0u, came);
    if (k < tokens) records[k] = came ? before + __popc(mask & ((1u << lane) - 1)) : -1;
    before += __popc(mask);
  }
}

// One warp, final pass of own tokens [first, last) whose partial routes are staged
// (stage_partial_routes, [tokens, nodes]): every other domain's entry of a token becomes its
// record in that domain's slot; `counts[n]` (if given) the records of domain n's slot.
__device__ __forceinline__ void stage_eager_records(const CombineParams& p, int32_t* rows,
                                                    int first, int last, int32_t* counts,
                                                    int lane) {
  const DomainView& d = p.domain;
  for (int k = 0; k < d.nodes - 1; ++k) {
    const int n = other_domain(k, d.node_rank);
    int before = 0;
    for (int base = first; base < last; base += 32) {
      const int t = base + lane;
      int32_t* row = rows + int64_t(t - first) * d.nodes + n;
      const bool on = t < last && *row >= 0;
      const uint32_t mask = __ballot_sync(~0u, on);
      if (on) *row = before + __popc(mask & ((1u << lane) - 1));
      before += __popc(mask);
    }
    if (counts != nullptr && lane == 0) counts[n] = before;
  }
  __syncwarp();
}

// Network warp `w` of `warps`: this block's chunks of other domains, each once every reduce
// warp has counted it done in `reduced`: one put counted and every tile's signal released.
__device__ __forceinline__ void send_eager_partials(const CombineParams& p, const ChunkWalk& walk,
                                                    const volatile uint32_t* reduced,
                                                    int reduce_warps, uint64_t epoch, int w,
                                                    int warps, int lane) {
  const CombineAcross& a = p.across;
  const DomainView& d = p.domain;
  const int channel = blockIdx.x % a.channels;
  for (int i = w; i < walk.pairs; i += warps) {
    const int k = walk.sent_item(p, i);
    const ChunkItem it = walk.pair_item(p, i);
    const bool* came = a.rdma_to_attn_map + it.node;
    const int first = it.first - it.node * a.max_tokens, last = first + (it.last - it.first);
    int records = 0;
    for (int base = first; base < last; base += 32) {
      records +=
          __popc(__ballot_sync(~0u, base + lane < last && came[int64_t(base + lane) * d.nodes]));
    }
    if (records == 0) continue;
    while (*reduced < uint32_t(reduce_warps * (k + 1)) && !d.aborted()) __nanosleep(64);
    const EagerPayload payload = eager_partials(p, records);
    const int64_t bytes = payload.bytes(), tiles = EagerTiles::count(bytes);
    const int other = other_domain_index(d.node_rank, it.node);
    const uint64_t value = eager_signal_value(epoch, uint32_t(it.c));
    uint8_t* peer = TransportDevice::mapped(a.transport, it.node);
    if (peer == nullptr) {  // the staging slot's signals, then one put of it
      uint8_t* staged = eager_staging_slot(p, it.node, it.c);
      for (int64_t t = lane; t < tiles; t += 32) {
        *reinterpret_cast<EagerSignal*>(staged + EagerTiles::signal_at(bytes, t)) = {value, 0};
      }
      TransportDevice::put_eager(a.transport, channel, it.node,
                                 a.net_partials + size_t(eager_slot_offset(p, other, it.c)), staged,
                                 bytes, lane);
      continue;
    }
    uint8_t* slot = eager_slot(p, peer + a.net_partials, other, it.c);
    const EagerDelivery due = TransportDevice::count_eager_stored(
        a.transport, channel, size_t(EagerTiles::wire_bytes(bytes)), tiles, lane);
    // The partials the reduce warps wrote (published to this warp through `reduced`), before
    // the signals: each lane's release pattern for its tiles.
    ptx::fence_acq_rel_sys();
    for (int64_t t = lane; t < tiles; t += 32) {
      const int64_t at = EagerTiles::signal_at(bytes, t);
      EagerSignal* signal = reinterpret_cast<EagerSignal*>(slot + at);
      // Delivered with its signal's last byte.
      ptx::store_pair_relaxed_sys(&signal->value, value, due.at(at + EagerTiles::kSignalBytes));
    }
  }
  TransportDevice::flush(a.transport, channel, lane);
}

// The loader warp's view, final pass of own chunk c, of the other domains' partials of it in
// their slots; landed[n] and records[n] (shared memory) are domain n's tiles seen and records.
struct EagerPartials {
  const uint8_t* ring;  // this rank's net_partials
  EagerPayload record;  // one record's shape
  uint64_t value;       // the signal the chunk's tiles carry this call
  int c;
  int32_t* landed;
  const int32_t* records;

  __device__ __forceinline__ EagerSlot slot(const CombineParams& p, int n) const {
    return {eager_slot(p, ring, other_domain_index(n, p.domain.node_rank), c),
            int64_t(records[n]) * record.record, value};
  }

  // All lanes, before the loads of a token whose routes are `rows` ([width] records, -1: not
  // there): waits for the tiles of its records from the other domains. A failed wait leaves
  // the abort word set and returns all the same (the loads go on, the call reports).
  __device__ __forceinline__ void wait_token(const CombineParams& p, const int32_t* rows, int width,
                                             int lane) const {
    const DomainView& d = p.domain;
    bool waited = false;
    for (int j0 = 0; j0 < width; j0 += 32) {
      const int j = j0 + lane;
      const int32_t k = j < width && j != d.node_rank ? rows[j] : -1;
      const int64_t last = k >= 0 ? record.last_tile_of(k) : -1;
      for (uint32_t behind = __ballot_sync(~0u, k >= 0 && landed[j] <= last); behind != 0;
           behind &= behind - 1) {
        const int from = __ffs(behind) - 1, n = j0 + from;
        int64_t seen = landed[n];
        wait_tiles(slot(p, n), seen, __shfl_sync(~0u, last, from), d, WaitSite::kNetworkCombine, n,
                   c, lane);
        __syncwarp();
        if (lane == 0) landed[n] = int32_t(seen);
        __syncwarp();
        waited = true;
      }
    }
    if (waited) ptx::fence_proxy_async_global();  // every lane's TMA loads read what was seen
  }

  // `bytes` of record k of domain n from `offset` on into `stage` at 0, one TMA load per tile
  // they span (the caller expects them).
  __device__ __forceinline__ void load(const CombineParams& p, const Ring& ring_, int stage, int n,
                                       int32_t k, int64_t offset, uint32_t bytes) const {
    const uint8_t* from = slot(p, n).slot;
    const int64_t begin = record.row_at(k) + offset, end = begin + bytes;
    for (int64_t b = begin; b < end;) {
      const int64_t piece = EagerTiles::piece(b, end);
      ring_.load(stage, uint32_t(b - begin), from + EagerTiles::wire_offset(b), uint32_t(piece));
      b += piece;
    }
  }
};

// combined_probs' value of column `col` (< prob_cols) of record k of domain n's slot of own
// chunk c (written by another process: from L2).
__device__ __forceinline__ float eager_final_prob(const CombineParams& p, int n, int c, int32_t k,
                                                  int col) {
  const EagerPayload record = eager_partials(p, 1);
  const uint8_t* slot = eager_slot(p, p.domain.self() + p.across.net_partials,
                                   other_domain_index(n, p.domain.node_rank), c);
  return __ldcg(reinterpret_cast<const float*>(
      slot + EagerTiles::wire_offset(record.row_at(k) + record.probs_at + int64_t(col) * 4)));
}

}  // namespace combine
}  // namespace hybrid_ep

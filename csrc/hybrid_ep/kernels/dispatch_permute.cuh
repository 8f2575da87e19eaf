// The permute role of the fused dispatch_with_permute (fuse_permute_dispatch): blocks of the
// dispatch grid turn received chunks into expert-major rows as they arrive (inside one domain
// every block, after sending its chunks; with several domains the blocks past the dispatch
// blocks, while those are still sending).
//   work item   : `slice` dispatch rows of one (source rank, chunk); item q belongs to permute
//                 block q % permute_blocks. Items are ordered as chunks complete: this domain's
//                 sources first, then chunk, then source, then slice.
//   own items   : this rank's own tokens for itself are not stored into its own buffer by the
//                 dispatch in this mode: their items read the caller's tensors, with no wait;
//   loader warp : the lanes find the item's rows that have an expert slot, lane 0 waits for
//                 the chunk's flag, then TMA-loads each of those rows into the shared-memory
//                 ring;
//   store warps : one bulk store per selected expert from the ring stage; lanes copy the row's
//                 prob for that expert and its FP8 scales;
//   zero warps  : the output rows that hold no data (padding, the tail past the data).
// The flags are the dispatch's: this kernel only reads the consumer counters (several blocks
// wait for one chunk), and advance_dispatch_expected moves them on after the kernel.
#pragma once

#include "hybrid_ep/common/ptx.cuh"
#include "hybrid_ep/kernels/common/flags.cuh"
#include "hybrid_ep/kernels/common/ring.cuh"
#include "hybrid_ep/kernels/common/ring_pos.cuh"
#include "hybrid_ep/kernels/params.h"

namespace hybrid_ep {

struct PermuteItem {
  int source_rank;  // local rank that forwarded the chunk
  int node;         // domain the chunk's tokens come from
  int chunk;
  int first, last;  // dispatch rows; this rank's tokens for an own item
  // This rank's own tokens: read from the caller's tensors, which the dispatch does not store
  // into this rank's own buffer in this mode, and ready without a wait.
  bool own;
};

__device__ __forceinline__ int permute_items(const DispatchParams& p) {
  const int slices = (p.chunk + p.permute.slice - 1) / p.permute.slice;
  return p.domain.nodes * p.max_chunks * p.domain.ranks * slices;
}

__device__ __forceinline__ PermuteItem permute_item(const DispatchParams& p, int q) {
  const DomainView& d = p.domain;
  const int slices = (p.chunk + p.permute.slice - 1) / p.permute.slice;
  PermuteItem it;
  const int k = q % slices;
  it.source_rank = (q / slices) % d.ranks;
  it.chunk = (q / (slices * d.ranks)) % p.max_chunks;
  it.node = (d.node_rank + q / (slices * d.ranks * p.max_chunks)) % d.nodes;
  it.own = it.node == d.node_rank && it.source_rank == d.local_rank;
  int begin, end;
  if (it.own) {
    const int tokens = min(p.num_tokens, p.max_tokens);
    begin = min(it.chunk * p.chunk, tokens);
    end = min(begin + p.chunk, tokens);
  } else {
    const int source = it.node * d.ranks + it.source_rank;
    begin = p.permute.chunk_layout[int64_t(source) * p.max_chunks + it.chunk];
    end = p.permute.chunk_layout[int64_t(source) * p.max_chunks + it.chunk + 1];
  }
  it.first = min(begin + k * p.permute.slice, end);
  it.last = min(it.first + p.permute.slice, end);
  return it;
}

__device__ __forceinline__ bool has_expert_slot(const DispatchParams& p, int row) {
  const int32_t* slots = p.permute.dense_to_expert_map + int64_t(row) * p.permute.experts_per_rank;
  for (int e = 0; e < p.permute.experts_per_rank; ++e) {
    if (slots[e] >= 0) return true;
  }
  return false;
}

// The dispatch row that index k of an item permutes (k is a token of an own item), or -1 when
// there is nothing to permute for it.
__device__ __forceinline__ int permute_row(const DispatchParams& p, const PermuteItem& it, int k) {
  const DomainView& d = p.domain;
  const int row = it.own
                      ? p.sparse_to_dense_map[(int64_t(d.node_rank) * p.max_tokens + k) * d.ranks +
                                              d.local_rank]
                      : k;
  return row >= 0 && has_expert_slot(p, row) ? row : -1;
}

// Where index k of an item reads its row, probs and scales: this rank's own token k from the
// caller's tensors, any other dispatch row k from this rank's registered buffer.
struct PermuteSource {
  const uint8_t* rows;
  const float* probs;  // the item's row's E columns of this rank at probs + k * prob_stride
  int64_t prob_stride;
  const float* scales;

  __device__ static PermuteSource of(const DispatchParams& p, const PermuteItem& it) {
    const uint8_t* self = p.domain.self();
    const bool probs = p.permute.out_probs != nullptr, scales = p.permute.out_scales != nullptr;
    if (it.own) {  // (a rank without tokens has null inputs, and no own rows)
      return {p.hidden,
              probs && p.probs != nullptr
                  ? p.probs + p.prob_col_offset + p.permute.local_prob_offset
                  : nullptr,
              p.experts_total, scales ? p.scales : nullptr};
    }
    return {
        self + p.dispatch_rows,
        probs
            ? reinterpret_cast<const float*>(self + p.dispatch_probs) + p.permute.local_prob_offset
            : nullptr,
        p.prob_cols, scales ? reinterpret_cast<const float*>(self + p.dispatch_scales) : nullptr};
  }
};

// Lane 0 of the loader: whether the item's chunk has arrived. Read-only on the counters.
__device__ __forceinline__ bool permute_chunk_arrived(const DispatchParams& p,
                                                      const PermuteItem& it) {
  const DomainView& d = p.domain;
  const size_t slot = p.dispatch_flags.slot(it.source_rank, it.node, it.chunk);
  const bool ok =
      wait_until(reinterpret_cast<const uint64_t*>(d.self() + slot), *d.expected_for(slot) + 1, d,
                 WaitSite::kDispatchChunk, it.source_rank, it.node * p.max_chunks + it.chunk);
  ptx::fence_proxy_async_global();  // the TMA loads below read what the flag published
  return ok;
}

// The indices of an item that have a row to permute, one per lane (index it.first + lane: an
// item holds at most 32): the loads that decide it are in flight at once, where one lane's
// walk waited on them row after row. `row` is this lane's dispatch row.
struct ItemRows {
  uint32_t mask;
  int row;
};

__device__ __forceinline__ ItemRows item_rows(const DispatchParams& p, const PermuteItem& it,
                                              int lane) {
  const int k = it.first + lane;
  const int row = k < it.last ? permute_row(p, it, k) : -1;
  return {__ballot_sync(~0u, row >= 0), row};
}

// Loader warp. `item`: ring items the block used before (its dispatch role's), where the ring
// goes on.
inline __device__ void permute_load_rows(const DispatchParams& p, const Ring& ring, int block,
                                         int lane, uint32_t item) {
  RingPos at = RingPos::of(item, ring.stages);  // lane 0's
  for (int q = block; q < permute_items(p); q += p.permute_blocks) {
    const PermuteItem it = permute_item(p, q);
    if (it.first >= it.last) continue;
    const ItemRows r = item_rows(p, it, lane);
    if (r.mask == 0) continue;
    if (lane == 0) {
      const bool arrived = it.own || permute_chunk_arrived(p, it);
      const uint8_t* rows = PermuteSource::of(p, it).rows;
      for (uint32_t m = r.mask; m != 0; m &= m - 1) {
        const int k = it.first + __ffs(m) - 1;
        const int stage = at.stage;
        ring.acquire(at);
        at.advance(1, ring.stages);
        if (!arrived) {  // pass the item on unloaded so that the store warps finish
          ring.skip(stage);
          continue;
        }
        ring.expect(stage, p.row_bytes);
        ring.load(stage, 0, rows + int64_t(k) * p.row_bytes, p.row_bytes);
      }
    }
    item += __popc(r.mask);
  }
}

// Store warp `w` of `warps`: ring items w, w + warps, ... counted from `item` as the loader.
inline __device__ void permute_store_rows(const DispatchParams& p, const Ring& ring, int block,
                                          int w, int warps, int lane, uint32_t item) {
  const int E = p.permute.experts_per_rank;
  // This warp's items are those with item % warps == w (warps < ring stages).
  RingPos at = RingPos::of(item + to_own_item(item, w, warps), ring.stages);
  int pending_stage = -1;
  for (int q = block; q < permute_items(p); q += p.permute_blocks) {
    const PermuteItem it = permute_item(p, q);
    if (it.first >= it.last) continue;
    const ItemRows r = item_rows(p, it, lane);
    const PermuteSource src = PermuteSource::of(p, it);
    const int n = __popc(r.mask);
    for (int j = to_own_item(item, w, warps); j < n; j += warps) {
      const int bit = __fns(r.mask, 0, j + 1);
      const int k = it.first + bit;
      const int i = __shfl_sync(~0u, r.row, bit);
      const int stage = at.stage;
      ring.wait(at);
      at.advance(warps, ring.stages);
      const int32_t* slots = p.permute.dense_to_expert_map + int64_t(i) * E;
      // Lane l holds expert e0 + l's output row and prob: the warp's loads are in flight at
      // once (one after the other, they left a row's stores waiting on a chain of loads).
      for (int e0 = 0; e0 < E; e0 += 32) {
        const int my_e = e0 + lane;
        const int my_o = my_e < E ? slots[my_e] : -1;
        if (src.probs != nullptr && my_o >= 0) {
          p.permute.out_probs[my_o] = src.probs[int64_t(k) * src.prob_stride + my_e];
        }
        for (int e = 0; e < min(32, E - e0); ++e) {
          const int o = __shfl_sync(~0u, my_o, e);
          if (o < 0) continue;
          if (lane == 0) {
            ptx::bulk_store(p.permute.out + int64_t(o) * p.row_bytes, ring.stage(stage),
                            p.row_bytes);
          }
          if (src.scales != nullptr) {
            for (int c = lane; c < p.scale_cols; c += 32) {
              p.permute.out_scales[int64_t(o) * p.scale_cols + c] =
                  src.scales[int64_t(k) * p.scale_cols + c];
            }
          }
        }
      }
      if (lane == 0) {
        ptx::bulk_commit();
        ptx::bulk_wait_read<1>();  // the previous item's stores no longer read its stage
        if (pending_stage >= 0) ring.release(pending_stage);
      }
      pending_stage = stage;
    }
    item += n;
  }
  if (lane == 0) {
    ptx::bulk_wait<0>();
    if (pending_stage >= 0) ring.release(pending_stage);
  }
}

// Zero warp `w` of `warps` in this block: output rows whose row_source is -1, 32 candidates
// per step (one per lane), each found row zeroed by the whole warp.
inline __device__ void permute_zero_rows(const DispatchParams& p, int block, int w, int warps,
                                         int lane) {
  const int P = p.permute.num_permuted;
  const int vectors = p.row_bytes / 16;
  const int all_warps = p.permute_blocks * warps;
  for (int base = (block * warps + w) * 32; base < P; base += all_warps * 32) {
    const int o = base + lane;
    uint32_t zero = __ballot_sync(~0u, o < P && p.permute.row_source[o] < 0);
    while (zero != 0) {
      const int z = base + __ffs(zero) - 1;
      zero &= zero - 1;
      uint4* row = reinterpret_cast<uint4*>(p.permute.out + int64_t(z) * p.row_bytes);
      for (int v = lane; v < vectors; v += 32) row[v] = make_uint4(0, 0, 0, 0);
      if (p.permute.out_probs != nullptr && lane == 0) p.permute.out_probs[z] = 0.f;
      if (p.permute.out_scales != nullptr) {
        for (int k = lane; k < p.scale_cols; k += 32) {
          p.permute.out_scales[int64_t(z) * p.scale_cols + k] = 0.f;
        }
      }
    }
  }
}

}  // namespace hybrid_ep

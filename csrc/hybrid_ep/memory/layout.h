// Where each region lives inside a rank's registered buffer. Every rank of a domain computes
// the same layout from the same config, so a peer's region is `peer_base + offset`.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hybrid_ep {

struct BufferShape {
  int64_t world;             // W: ranks in the group
  int64_t ranks;             // R: ranks per NVLink domain
  int64_t experts_per_rank;  // E
  int64_t max_tokens;        // T: tokens per rank the buffer holds
  int64_t max_row_bytes;     // bytes of one hidden row at the widest dtype (BF16: 2 * H)
  int64_t max_scale_cols;    // FP8 scaling factors per row (H / 128)
  int64_t dispatch_chunk;    // tokens per dispatch chunk

  int64_t experts_total() const { return experts_per_rank * world; }
  int64_t prob_cols() const { return experts_per_rank * ranks; }  // one domain's columns
  int64_t max_rows() const { return world * max_tokens; }         // worst case received rows
  int64_t max_chunks() const { return (max_tokens + dispatch_chunk - 1) / dispatch_chunk; }
  int64_t nodes() const { return world / ranks; }
};

struct BufferLayout {
  // Registered (peer-visible) regions, byte offsets from the buffer base.
  size_t routing;          // bool [W*T, E_total]: every rank's routing map (allgather)
  size_t token_counts;     // uint64 [W]: tokens of each rank this call (for growth)
  size_t dispatch_rows;    // [W*T, row bytes]: rows dispatched to this rank
  size_t dispatch_probs;   // fp32 [W*T, E*R]
  size_t dispatch_scales;  // fp32 [W*T, H/128]
  size_t combine_rows;     // [W*T, 2 x row bytes]: this rank's combine input (BF16 rows, or the
                           // fp32 sums of the unpermute path), pulled by peers
  size_t combine_probs;    // fp32 [W*T, E*R]
  size_t net_rows;         // [N, T, row bytes]: rows from the peer of each domain (receive tiles)
  size_t barrier_flags;    // uint64 [R]: one per sending local rank
  size_t allgather_flags;  // uint64 [R]
  size_t dispatch_flags;   // uint64 [R, max chunks]
  size_t network_flags;    // uint64 [N, max chunks]: signals from the peer of each domain
  size_t flags_begin, flags_end;
  size_t total;

  static size_t align(size_t v) { return (v + 255) & ~size_t(255); }

  static BufferLayout make(const BufferShape& s) {
    BufferLayout l{};
    size_t at = 0;
    auto take = [&at](size_t bytes) {
      const size_t here = at;
      at = align(at + bytes);
      return here;
    };
    const size_t rows = static_cast<size_t>(s.max_rows());
    l.routing = take(rows * static_cast<size_t>(s.experts_total()));
    l.token_counts = take(sizeof(uint64_t) * s.world);
    l.dispatch_rows = take(rows * s.max_row_bytes);
    l.dispatch_probs = take(rows * s.prob_cols() * sizeof(float));
    l.dispatch_scales = take(rows * s.max_scale_cols * sizeof(float));
    l.combine_rows = take(rows * s.max_row_bytes * 2);
    l.combine_probs = take(rows * s.prob_cols() * sizeof(float));
    l.net_rows = take(size_t(s.nodes() * s.max_tokens) * s.max_row_bytes);
    l.flags_begin = at;
    l.barrier_flags = take(sizeof(uint64_t) * s.ranks);
    l.allgather_flags = take(sizeof(uint64_t) * s.ranks);
    l.dispatch_flags = take(sizeof(uint64_t) * s.ranks * s.max_chunks());
    l.network_flags = take(sizeof(uint64_t) * s.nodes() * s.max_chunks());
    l.flags_end = at;
    l.total = at;
    return l;
  }
};

}  // namespace hybrid_ep

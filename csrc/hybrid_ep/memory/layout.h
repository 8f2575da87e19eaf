// Where each region lives inside a rank's registered buffer. Every rank of a domain computes
// the same layout from the same config, so a peer's region is `peer_base + offset`.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hybrid_ep {

// A fused unpermute's unit, the dispatch rows of one (source, chunk), is split into this many
// slices, each its own work item and flag: a chunk's rows spread over several blocks.
constexpr int kUnpermuteSlices = 4;

struct BufferShape {
  int64_t world;             // W: ranks in the group
  int64_t ranks;             // R: ranks per NVLink domain
  int64_t experts_per_rank;  // E
  int64_t max_tokens;        // T: tokens per rank the buffer holds
  int64_t max_row_bytes;     // bytes of one hidden row at the widest dtype (BF16: 2 * H)
  int64_t max_scale_cols;    // FP8 scaling factors per row (H / 128)
  int64_t dispatch_chunk;    // tokens per dispatch chunk
  int64_t partial_bytes;     // bytes per value of the combine's partials between domains (2, 4)

  int64_t experts_total() const { return experts_per_rank * world; }
  int64_t prob_cols() const { return experts_per_rank * ranks; }  // one domain's columns
  int64_t max_rows() const { return world * max_tokens; }         // worst case received rows
  int64_t max_chunks() const { return (max_tokens + dispatch_chunk - 1) / dispatch_chunk; }
  int64_t nodes() const { return world / ranks; }
};

struct BufferLayout {
  // Registered (peer-visible) regions, byte offsets from the buffer base.
  size_t routing;       // bool [W*T, E_total]: every rank's routing map (allgather)
  size_t token_counts;  // uint64 [W]: tokens of each rank this call (for growth)
  size_t call_stamps;   // uint64 [W]: each rank's stamp of this call (routing all-gather)
  // uint64 [2][R] and [2][N]: the stamps a barrier carries from each local rank and from the
  // peer of each domain, by parity of the barrier's count (a peer's next barrier cannot
  // overwrite a stamp not read yet).
  size_t barrier_stamps;
  size_t net_barrier_stamps;
  size_t dispatch_rows;    // [W*T, row bytes]: rows dispatched to this rank
  size_t dispatch_probs;   // fp32 [W*T, E*R]
  size_t dispatch_scales;  // fp32 [W*T, H/128]
  size_t combine_rows;     // [W*T, 2 x row bytes]: this rank's combine input (BF16 rows, or the
                           // fp32 sums of the unpermute path), pulled by peers
  size_t combine_probs;    // fp32 [W*T, E*R]
  // Several domains only (empty with one): receive tiles from the peer of each domain, and the
  // local sources of this rank's puts (registered, as RDMA transports need).
  size_t net_rows;           // [N, T, row bytes]: dispatched rows from the peer of domain n
  size_t net_probs;          // fp32 [N, T, E*R]: their probs (the receiving domain's columns)
  size_t net_scales;         // fp32 [N, T, H/128]: their FP8 scales
  size_t restriped_probs;    // fp32 [N, T, E*R]: this rank's probs, destination-major
  size_t staged_rows;        // [T, row bytes]: this rank's rows, for registered-source puts
  size_t staged_scales;      // fp32 [T, H/128]
  size_t partials;           // [N, T, H] of partial_bytes: this domain's sums per forwarded token
  size_t partial_probs;      // fp32 [N, T, E*R]
  size_t net_partials;       // [N, T, H]: partial sums of this rank's tokens from domain n
  size_t net_partial_probs;  // fp32 [N, T, E*R]
  size_t barrier_flags;      // uint64 [R]: one per sending local rank (barrier, all-gather)
  size_t forward_flags;      // uint64 [R]: the other domains' maps forwarded by local rank j
  size_t dispatch_flags;     // uint64 [R, N * max chunks]: (forwarding rank, domain, chunk)
  size_t unpermute_flags;    // uint64 [R, N * max chunks, kUnpermuteSlices]: fused unpermute
  size_t network_flags;      // uint64 [N, max chunks]: dispatch chunks from the peer of domain n
  size_t combine_flags;      // uint64 [N, max chunks]: combine partials from the peer of domain n
  size_t net_barrier_flags;  // uint64 [N]
  size_t receive_releases;   // uint64: times this rank has read its dispatch_rows out
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
    l.call_stamps = take(sizeof(uint64_t) * s.world);
    l.barrier_stamps = take(sizeof(uint64_t) * 2 * s.ranks);
    l.net_barrier_stamps = take(sizeof(uint64_t) * 2 * s.nodes());
    l.dispatch_rows = take(rows * s.max_row_bytes);
    l.dispatch_probs = take(rows * s.prob_cols() * sizeof(float));
    l.dispatch_scales = take(rows * s.max_scale_cols * sizeof(float));
    l.combine_rows = take(rows * s.max_row_bytes * 2);
    l.combine_probs = take(rows * s.prob_cols() * sizeof(float));
    const size_t tiles = s.nodes() > 1 ? size_t(s.nodes() * s.max_tokens) : 0;  // N*T
    const size_t prob_row = s.prob_cols() * sizeof(float);
    const size_t hidden = s.max_row_bytes / 2;
    l.net_rows = take(tiles * s.max_row_bytes);
    l.net_probs = take(tiles * prob_row);
    l.net_scales = take(tiles * s.max_scale_cols * sizeof(float));
    l.restriped_probs = take(tiles * prob_row);
    const size_t own = s.nodes() > 1 ? size_t(s.max_tokens) : 0;
    l.staged_rows = take(own * s.max_row_bytes);
    l.staged_scales = take(own * s.max_scale_cols * sizeof(float));
    l.partials = take(tiles * hidden * size_t(s.partial_bytes));
    l.partial_probs = take(tiles * prob_row);
    l.net_partials = take(tiles * hidden * size_t(s.partial_bytes));
    l.net_partial_probs = take(tiles * prob_row);
    l.flags_begin = at;
    l.barrier_flags = take(sizeof(uint64_t) * s.ranks);
    l.forward_flags = take(sizeof(uint64_t) * s.ranks);
    l.dispatch_flags = take(sizeof(uint64_t) * s.ranks * s.nodes() * s.max_chunks());
    l.unpermute_flags =
        take(sizeof(uint64_t) * s.ranks * s.nodes() * s.max_chunks() * kUnpermuteSlices);
    l.network_flags = take(sizeof(uint64_t) * s.nodes() * s.max_chunks());
    l.combine_flags = take(sizeof(uint64_t) * s.nodes() * s.max_chunks());
    l.net_barrier_flags = take(sizeof(uint64_t) * s.nodes());
    l.receive_releases = take(sizeof(uint64_t));
    l.flags_end = at;
    l.total = at;
    return l;
  }
};

}  // namespace hybrid_ep

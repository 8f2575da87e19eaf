// Where each region lives inside a rank's registered buffer. Every rank of a domain computes
// the same layout from the same config, so a peer's region is `peer_base + offset`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "hybrid_ep/memory/eager_tiles.h"
#include "hybrid_ep/memory/flag_tables.h"

namespace hybrid_ep {

struct BufferShape {
  int64_t world;             // W: ranks in the group
  int64_t ranks;             // R: ranks per NVLink domain
  int64_t experts_per_rank;  // E
  int64_t max_tokens;        // T: tokens per rank the buffer holds
  int64_t max_row_bytes;     // bytes of one hidden row at the widest dtype (BF16: 2 * H)
  int64_t max_scale_cols;    // FP8 scaling factors per row (H / 128)
  int64_t dispatch_chunk;    // tokens per dispatch chunk
  int64_t partial_bytes;     // bytes per value of the combine's partials between domains (2, 4)
  int64_t net_ring_chunks;   // K: chunk slots per other domain of the rings between domains
  // M: rows the in-domain receive regions hold (dispatch_*, combine_*), 1..W*T (W*T: every
  // token of every rank routed here). Rows past it are dropped or grown (docs/usage.md, "The
  // receive cap").
  int64_t max_received;
  // Bytes of the zero-copy pool (docs/zero-copy.md): dispatch outputs and combine inputs that
  // peers write and read in place. 0: none (several domains, or HYBRID_EP_ZERO_COPY=0).
  int64_t zero_copy_pool_bytes;
  // HYBRID_EP_EAGER (several domains): the rows between domains travel in the eager form's
  // tile layout (memory/eager_tiles.h), a chunk's rows, probs and scales as one record per
  // token in one slot of net_rows; net_probs and net_scales are then empty. So do the
  // combine's partials, a record of partial and probs per token in one slot of net_partials
  // (net_partial_probs empty).
  bool eager = false;
  // The eager form towards peers that are not mapped (RDMA builds): a chunk's tiles are written
  // into a local slot of eager_rows_staging / eager_partials_staging, the one write's source.
  bool eager_staged = false;

  int64_t experts_total() const { return experts_per_rank * world; }
  int64_t prob_cols() const { return experts_per_rank * ranks; }  // one domain's columns
  int64_t max_rows() const { return world * max_tokens; }         // every rank's tokens (W*T)
  int64_t max_chunks() const { return (max_tokens + dispatch_chunk - 1) / dispatch_chunk; }
  int64_t nodes() const { return world / ranks; }
  // Rows of the rings between domains: K chunk slots per other domain (empty with one domain).
  int64_t ring_rows() const {
    return nodes() > 1 ? (nodes() - 1) * net_ring_chunks * dispatch_chunk : 0;
  }
  // The largest eager record of a token (a BF16 row with probs, or an FP8 row with probs and
  // scales), and the net_rows slot a chunk of them takes in the eager form.
  int64_t eager_record() const {
    const int64_t probs = prob_cols() * 4, scales = max_scale_cols * 4;
    const EagerPayload bf16 = EagerPayload::make(1, max_row_bytes, probs, 0);
    const EagerPayload fp8 = EagerPayload::make(1, max_row_bytes / 2, probs, scales);
    return bf16.record > fp8.record ? bf16.record : fp8.record;
  }
  int64_t eager_slot_bytes() const {
    return EagerTiles::slot_bytes(dispatch_chunk * eager_record());
  }
  // The combine's: a token's partial (at the wire's width) and its probs; a chunk of them.
  int64_t combine_eager_record() const {
    return EagerPayload::make(1, partial_row_bytes(), prob_cols() * 4, 0).record;
  }
  int64_t combine_eager_slot_bytes() const {
    return EagerTiles::slot_bytes(dispatch_chunk * combine_eager_record());
  }
  int64_t partial_row_bytes() const { return max_row_bytes / 2 * partial_bytes; }
  // 32-bit words of one token's routing bits for one domain (a bit per column of the domain).
  int64_t routing_words() const { return (prob_cols() + 31) / 32; }
  // The flag tables' shapes (memory/flag_tables.h), at the buffer's chunk count.
  FlagTables flag_shapes() const {
    return FlagTables::shaped(int(ranks), int(nodes()), int(max_chunks()));
  }
};

// The default depth (HYBRID_EP_NET_RING_CHUNKS unset): every chunk while one region's ring of
// every chunk stays within kNetFullRingBytes (no sender then waits for a credit within a call:
// 4 x 2 combine 3643 -> 3466 us at K = 24 -> 64, benchmarks/results/2026-12-02-credits-tail.md),
// else the deepest ring of whole chunks per other domain within kNetRingBudgetBytes, at least
// one chunk. At hidden 7168, 64-token chunks and 4096 tokens: every chunk up to 5 domains, 10
// at 8, 1 at 64.
constexpr int64_t kNetFullRingBytes = int64_t(256) << 20;
constexpr int64_t kNetRingBudgetBytes = int64_t(64) << 20;

// K for `requested` chunk slots per other domain (0: the default above).
inline int64_t net_ring_chunks_for(int64_t requested, int64_t nodes, int64_t dispatch_chunk,
                                   int64_t max_chunks, int64_t row_bytes) {
  if (requested > 0) return requested < max_chunks ? requested : max_chunks;
  const int64_t slot = (nodes > 1 ? nodes - 1 : 1) * dispatch_chunk * row_bytes;
  if (slot * max_chunks <= kNetFullRingBytes) return max_chunks;
  // Past the full ring's budget the smaller one holds under a quarter of the chunks.
  const int64_t fits = kNetRingBudgetBytes / slot;
  return fits < 1 ? 1 : fits;
}

// Where the rings between domains hold chunk c of the domain at index `other` among the other
// domains (other_domain_index): row `ring_slot_row(...) + (t - c * chunk)` of a [N-1, K, chunk]
// region holds token t of that chunk.
__host__ __device__ inline int64_t ring_slot_row(int other, int c, int ring_chunks, int chunk) {
  return (int64_t(other) * ring_chunks + c % ring_chunks) * chunk;
}

struct BufferLayout {
  // Registered (peer-visible) regions, byte offsets from the buffer base.
  // uint32 [W*T, routing words]: every rank's tokens' bits for this domain's experts, filled
  // by the routing all-gather (format: kernels/common/routing_bits.h).
  size_t routing;
  // [N-1, T, routing words]: this rank's bits for each other domain (its network puts' source)
  size_t staged_routing;
  size_t token_counts;  // uint64 [W]: tokens of each rank this call (for growth)
  size_t call_stamps;   // uint64 [W]: each rank's stamp of this call (routing all-gather)
  // uint64 [2][R] and [2][N]: the stamps a barrier carries from each local rank and from the
  // peer of each domain, by parity of the barrier's count (a peer's next barrier cannot
  // overwrite a stamp not read yet).
  size_t barrier_stamps;
  size_t net_barrier_stamps;
  // The in-domain receive regions, of M = BufferShape::max_received rows.
  size_t dispatch_rows;    // [M, row bytes]: rows dispatched to this rank
  size_t dispatch_probs;   // fp32 [M, E*R]
  size_t dispatch_scales;  // fp32 [M, H/128]
  size_t combine_rows;     // [M, 2 x row bytes]: this rank's combine input (BF16 rows, or the
                           // fp32 sums of the unpermute path), pulled by peers
  size_t combine_probs;    // fp32 [M, E*R]
  // Several domains only (empty with one): rings of K chunk slots per other domain (the
  // receiver returns a credit per consumed slot; docs/multi-domain.md, "Rings"), and the local
  // sources of this rank's puts (registered, as RDMA transports need).
  size_t net_rows;           // ring [N-1, K, chunk, row bytes]: rows from the other domains' peers
                             // (eager: [N-1, K] slots of eager_slot_bytes, records in tiles)
  size_t net_probs;          // fp32 ring: their probs (the receiving domain's columns)
  size_t net_scales;         // fp32 ring: their FP8 scales
  size_t restriped_probs;    // fp32 [N, T, E*R]: this rank's probs, destination-major
  size_t staged_rows;        // [T, row bytes]: this rank's rows, for registered-source puts
  size_t staged_scales;      // fp32 [T, H/128]
  size_t partials;           // [T + ring rows, H] of partial_bytes: this domain's sums of this
                             // rank's own tokens, then a ring of the other domains' (put sources)
  size_t partial_probs;      // fp32 [T + ring rows, E*R]
  size_t net_partials;       // ring [N-1, K, chunk, H]: partials of this rank's tokens from the
                             // other domains
  size_t net_partial_probs;  // fp32 ring
  // The eager form towards unmapped peers (BufferShape::eager_staged): rings [N-1, K] of local
  // slots (the size of net_rows' and net_partials', one ring per destination domain), where the
  // kernels write a chunk's tiles for the transport's one write (put_eager); a slot is
  // rewritten once its chunk was credited back.
  size_t eager_rows_staging;
  size_t eager_partials_staging;
  // ReceiveTargets (kernels/params.h): where this call's dispatch rows land in this rank's
  // buffer and where its combine input lies, published before peers read them.
  size_t receive_targets;
  // uint64 [R]: combines local rank j has finished pulling from this rank (slot j; this rank's
  // own slot: its combines), so that its input is reused only after every peer's reads.
  size_t combine_pulled;
  size_t zero_copy_pool;  // [zero_copy_pool_bytes]: blocks handed out as torch tensors
  size_t barrier_flags;   // uint64 [R]: one per sending local rank (barrier, all-gather)
  size_t forward_flags;   // uint64 [R]: the other domains' maps forwarded by local rank j
  // The flag tables (memory/flag_tables.h; flag_tables() below).
  size_t dispatch_flags;   // uint64 [R, N, max chunks]: (forwarding rank, domain, chunk)
  size_t unpermute_flags;  // uint64 [R, N, max chunks, kUnpermuteSlices]: fused unpermute
  size_t network_flags;    // uint64 [N, max chunks]: dispatch chunks from the peer of domain n
  size_t combine_flags;    // uint64 [N, max chunks]: combine partials from the peer of domain n
  // uint64 [N, max chunks]: credits, chunk c's ring slot consumed by the peer of domain n (the
  // dispatch's rows there; the combine's partials there).
  size_t dispatch_credits;
  size_t combine_credits;
  size_t net_barrier_flags;  // uint64 [N]
  size_t receive_releases;   // uint64: times this rank has read its dispatch_rows out
  // uint64 [2] per operation (eager form; dispatch, then combine, kEagerEpochWords apart): this
  // rank's epoch (its kernels so far; it derives the tile signals' values) and the blocks of
  // the running kernel done with it (EagerEpoch).
  size_t eager_epoch;
  static constexpr size_t kEagerEpochWords = 2;
  size_t flags_begin, flags_end;
  size_t total;

  static size_t align(size_t v) { return (v + 255) & ~size_t(255); }

  // Every region in buffer order, as visit(name, member, bytes): make() places them and the
  // memory plan (bindings/layout.cpp) reports them from the same walk.
  template <class Visit>
  static void for_each_region(const BufferShape& s, Visit&& visit) {
    const size_t u64 = sizeof(uint64_t), f32 = sizeof(float);
    const size_t rows = static_cast<size_t>(s.max_rows());
    const size_t received = static_cast<size_t>(s.max_received);
    const size_t nodes = size_t(s.nodes()), ranks = size_t(s.ranks);
    const FlagTables flags = s.flag_shapes();
    const size_t prob_row = s.prob_cols() * f32, scale_row = s.max_scale_cols * f32;
    const size_t tiles = nodes > 1 ? nodes * size_t(s.max_tokens) : 0;  // N*T
    const size_t own = nodes > 1 ? size_t(s.max_tokens) : 0;
    const size_t ring = size_t(s.ring_rows());
    const size_t partial_row = size_t(s.partial_row_bytes());
    const size_t routing_row = size_t(s.routing_words()) * sizeof(uint32_t);
    visit("routing", &BufferLayout::routing, rows * routing_row);
    visit("staged_routing", &BufferLayout::staged_routing,
          (nodes - 1) * size_t(s.max_tokens) * routing_row);
    visit("token_counts", &BufferLayout::token_counts, u64 * s.world);
    visit("call_stamps", &BufferLayout::call_stamps, u64 * s.world);
    visit("barrier_stamps", &BufferLayout::barrier_stamps, u64 * 2 * ranks);
    visit("net_barrier_stamps", &BufferLayout::net_barrier_stamps, u64 * 2 * nodes);
    visit("dispatch_rows", &BufferLayout::dispatch_rows, received * s.max_row_bytes);
    visit("dispatch_probs", &BufferLayout::dispatch_probs, received * prob_row);
    visit("dispatch_scales", &BufferLayout::dispatch_scales, received * scale_row);
    visit("combine_rows", &BufferLayout::combine_rows, received * s.max_row_bytes * 2);
    visit("combine_probs", &BufferLayout::combine_probs, received * prob_row);
    const size_t slots = s.dispatch_chunk > 0 ? ring / size_t(s.dispatch_chunk) : 0;
    visit("net_rows", &BufferLayout::net_rows,
          s.eager ? slots * size_t(s.eager_slot_bytes()) : ring * s.max_row_bytes);
    visit("net_probs", &BufferLayout::net_probs, s.eager ? 0 : ring * prob_row);
    visit("net_scales", &BufferLayout::net_scales, s.eager ? 0 : ring * scale_row);
    visit("restriped_probs", &BufferLayout::restriped_probs, tiles * prob_row);
    visit("staged_rows", &BufferLayout::staged_rows, own * s.max_row_bytes);
    visit("staged_scales", &BufferLayout::staged_scales, own * scale_row);
    visit("partials", &BufferLayout::partials, (own + ring) * partial_row);
    visit("partial_probs", &BufferLayout::partial_probs, (own + ring) * prob_row);
    visit("net_partials", &BufferLayout::net_partials,
          s.eager ? slots * size_t(s.combine_eager_slot_bytes()) : ring * partial_row);
    visit("net_partial_probs", &BufferLayout::net_partial_probs, s.eager ? 0 : ring * prob_row);
    const size_t staged = s.eager && s.eager_staged ? slots : 0;
    visit("eager_rows_staging", &BufferLayout::eager_rows_staging,
          staged * size_t(s.eager_slot_bytes()));
    visit("eager_partials_staging", &BufferLayout::eager_partials_staging,
          staged * size_t(s.combine_eager_slot_bytes()));
    visit("receive_targets", &BufferLayout::receive_targets, u64 * 8);
    visit("combine_pulled", &BufferLayout::combine_pulled, u64 * ranks);
    visit("zero_copy_pool", &BufferLayout::zero_copy_pool, size_t(s.zero_copy_pool_bytes));
    // The flags, from barrier_flags on, are zeroed together (flags_begin..flags_end).
    visit("barrier_flags", &BufferLayout::barrier_flags, flags.barrier.bytes());
    visit("forward_flags", &BufferLayout::forward_flags, flags.forward.bytes());
    visit("dispatch_flags", &BufferLayout::dispatch_flags, flags.dispatch.bytes());
    visit("unpermute_flags", &BufferLayout::unpermute_flags, flags.unpermute.bytes());
    visit("network_flags", &BufferLayout::network_flags, flags.network.bytes());
    visit("combine_flags", &BufferLayout::combine_flags, flags.combine.bytes());
    visit("dispatch_credits", &BufferLayout::dispatch_credits, flags.dispatch_credits.bytes());
    visit("combine_credits", &BufferLayout::combine_credits, flags.combine_credits.bytes());
    visit("net_barrier_flags", &BufferLayout::net_barrier_flags, flags.net_barrier.bytes());
    visit("receive_releases", &BufferLayout::receive_releases, u64);
    visit("eager_epoch", &BufferLayout::eager_epoch, u64 * 2 * kEagerEpochWords);
  }

  static BufferLayout make(const BufferShape& s) {
    BufferLayout l{};
    size_t at = 0;
    for_each_region(s, [&](const char*, size_t BufferLayout::* region, size_t bytes) {
      if (region == &BufferLayout::barrier_flags) l.flags_begin = at;
      l.*region = at;
      at = align(at + bytes);
    });
    l.flags_end = at;
    l.total = at;
    return l;
  }

  // The flag tables of a buffer of shape `s` laid out so.
  FlagTables flag_tables(const BufferShape& s) const {
    FlagTables t = s.flag_shapes();
    t.barrier.at = barrier_flags;
    t.forward.at = forward_flags;
    t.dispatch.at = dispatch_flags;
    t.unpermute.at = unpermute_flags;
    t.network.at = network_flags;
    t.combine.at = combine_flags;
    t.dispatch_credits.at = dispatch_credits;
    t.combine_credits.at = combine_credits;
    t.net_barrier.at = net_barrier_flags;
    return t;
  }
};

}  // namespace hybrid_ep

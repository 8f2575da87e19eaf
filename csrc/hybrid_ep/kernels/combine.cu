// Combine inside the NVLink domain: persistent, one CTA per SM, warp-specialised. The unit of work
// is one piece of a token's row (a row is split into `pieces` equal column ranges when whole
// rows would leave too few ring stages, e.g. for the fp32 rows of the unpermute path).
//   loader warp  : TMA-pulls every copy of a piece from the registered combine buffers of the
//                  ranks that received the token (this rank's own copies, inside one domain,
//                  from the caller's input) into consecutive stages of a shared-memory ring,
//                  one lane per rank issuing a piece's copies at once;
//   reduce warps : each owns every kReduceWarps-th piece of a chunk; once all copies of its
//                  piece are in, its lanes add them in fp32 (ascending local rank, as the
//                  reference does) and store the BF16 sum to the output, the warp hands the
//                  stages back and writes the routed-back probs (first piece, loaded by the
//                  lanes). A piece with a single BF16 copy leaves by one TMA bulk store of its
//                  stage instead: the lanes never touch it (on one rank, where every token has
//                  one copy, that made the kernel 2.5x faster than lane stores: 468 -> 185 us).
// With several domains (`partial`) the sums become partials (rounded once to the wire's width)
// of every forwarded token, and in the same launch network warps put each reduced chunk to its
// tokens' sources and the reduce warps add the domains' partials of this rank's own tokens
// (combine_across.cuh).
// Runs after a domain barrier that guarantees every peer's combine buffer is filled; fused with
// unpermute (combine_unpermute.cuh), the grid's blocks fill it first (inside one domain every
// block, with several domains extra blocks) while the loader waits per chunk.
#include <algorithm>
#include <cub/warp/warp_scan.cuh>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/common/ptx.cuh"
#include "hybrid_ep/kernels/combine_across.cuh"
#include "hybrid_ep/kernels/combine_ring.cuh"
#include "hybrid_ep/kernels/combine_sum.cuh"
#include "hybrid_ep/kernels/combine_unpermute.cuh"
#include "hybrid_ep/kernels/combine_walk.cuh"
#include "hybrid_ep/kernels/common/chunk_routes.cuh"
#include "hybrid_ep/kernels/common/eager_epoch.cuh"
#include "hybrid_ep/kernels/common/launch.h"
#include "hybrid_ep/kernels/common/ring.cuh"
#include "hybrid_ep/kernels/common/ring_pos.cuh"
#include "hybrid_ep/kernels/common/smem_plan.h"
#include "hybrid_ep/kernels/params.h"

namespace hybrid_ep {
namespace {

// The roles, the shared-memory plan and the passes (combine_ring.cuh); the walk
// (combine_across.cuh).
using namespace combine;

// The loader's copies of the tokens [first, last) whose routes are staged in `routes`: one
// piece of a token at once, one lane per source: each present lane finds its copy's stage from
// the sources before it, waits for that stage and issues its TMA load. Issued copy by copy from
// lane 0, each copy's chain (route and source loads, the wait, the issue) bounded the combine
// at two ranks x 8 SMs (ncu: the reduce warps waited on the issue counter while the loader
// seldom waited for a free stage); one chain per token took it from 233 to 208 us
// (benchmarks/results/2026-12-01-combine-loader.md).
// `eager` (final pass, the eager form): the other domains' partials are records in tiles, each
// token's waited for before its loads.
__device__ __forceinline__ void issue_copies(const CombineParams& p, const Smem& s,
                                             const PassShape& shape, const ChunkRoutes& routes,
                                             int first, int last, LoaderCursor& cur,
                                             const combine::EagerPartials* eager, int lane) {
  const Ring& ring = s.ring;
  const uint32_t lanes_before = (1u << lane) - 1;
  for (int t = first; t < last; ++t) {
    const int32_t* rows = routes.token(t - first);
    if (eager != nullptr) eager->wait_token(p, rows, shape.width, lane);
    for (int piece = 0; piece < shape.pieces; ++piece) {
      for (int j0 = 0; j0 < shape.width; j0 += 32) {  // sources past 32: 32 at a time
        const int j = j0 + lane;
        const int32_t row = j < shape.width ? rows[j] : -1;
        const uint32_t present = __ballot_sync(~0u, row >= 0);
        if (row >= 0) {
          // copies <= width <= stages: at most one wrap
          const RingPos mine = cur.at.plus(__popc(present & lanes_before), ring.stages);
          ring.acquire(mine);
          ring.expect(mine.stage, shape.piece_bytes);
          if (eager != nullptr && j != p.domain.node_rank) {
            eager->load(p, ring, mine.stage, j, row, int64_t(piece) * shape.piece_bytes,
                        shape.piece_bytes);
          } else {
            ring.load(
                mine.stage, 0,
                shape.sources[j] + row * shape.row_bytes() + int64_t(piece) * shape.piece_bytes,
                shape.piece_bytes);
          }
        }
        const int copies = __popc(present);
        cur.item += copies;
        cur.at.advance(copies, ring.stages);
        __syncwarp();  // every lane has issued its load
        if (lane == 0) *static_cast<volatile uint32_t*>(s.issued) = cur.item;
      }
    }
  }
}

// Loader warp, final pass (several domains): own chunk j, once this block's partials of it are
// written and every other domain's have arrived, the partials of each token.
template <bool kEager>
__device__ __forceinline__ void load_partials(const CombineParams& p, const Smem& s,
                                              const ChunkWalk& walk, int j, LoaderCursor& cur,
                                              int lane) {
  const PassShape shape = pass_shape(p, s, Pass::kFinal);
  const ChunkRoutes routes{s.loader_rows, shape.width};
  const combine::OwnChunk own = combine::own_chunk(p, j);
  if (lane == 0) {
    combine::wait_partials(p, s.reduced, kReduceWarps * walk.reduced_through_own(p, j), own.c);
  }
  __syncwarp();  // every lane is done with the previous chunk's routes
  combine::stage_partial_routes(p, routes, own.first, own.last, lane, 32);
  __syncwarp();
  if constexpr (!kEager) {
    issue_copies(p, s, shape, routes, own.first, own.last, cur, nullptr, lane);
    return;
  }
  combine::stage_eager_records(p, routes.rows, own.first, own.last, s.domain_records, lane);
  for (int n = lane; n < p.domain.nodes; n += 32) s.landed[n] = 0;
  __syncwarp();
  const combine::EagerPartials eager{p.domain.self() + p.across.net_partials,
                                     combine::eager_partials(p, 1),
                                     eager_signal_value(*s.epoch, uint32_t(own.c)),
                                     own.c,
                                     s.landed,
                                     s.domain_records};
  issue_copies(p, s, shape, routes, own.first, own.last, cur, &eager, lane);
}

// Loader warp: the walk step by step (ChunkWalk); each first-pass chunk's routes are staged (the
// next chunk's are loaded into registers meanwhile) and its copies issued; with several domains
// the final passes come between them.
template <bool kEager>
__device__ __forceinline__ void load_walk(const CombineParams& p, const Smem& s,
                                          const ChunkWalk& walk, int lane) {
  const PassShape shape = pass_shape(p, s, Pass::kReduce);
  const ChunkRoutes routes{s.loader_rows, shape.width};
  WalkCursor at;
  const auto fetch = [&](HeldRoutes& held) {
    ChunkItem it;
    if (!walk.next_first(p, at, it)) return held.clear();
    held.fetch(p.sparse_to_dense_map, it.first, it.last, shape.width, lane, 32);
  };
  LoaderCursor cur;
  HeldRoutes next;
  fetch(next);
  for (WalkStep step = walk.step(p, at); step.kind != WalkStep::kDone; step = walk.step(p, at)) {
    if (step.kind == WalkStep::kFinal) {
      load_partials<kEager>(p, s, walk, step.own, cur, lane);
      continue;
    }
    const ChunkItem& chunk = step.item;
    __syncwarp();  // every lane is done with the previous chunk's routes
    next.put(routes, lane, 32);
    fetch(next);
    // After a failed wait the stages are loaded anyway: the reduce warps must finish, and the
    // abort word makes the call report instead of returning what it read.
    if (p.unpermute_blocks > 0 && lane == 0) wait_unpermuted(p, chunk.first, chunk.last);
    __syncwarp();
    issue_copies(p, s, shape, routes, chunk.first, chunk.last, cur, nullptr, lane);
  }
}

// The probs row a token's reduction writes: combined_probs (all domains' columns, this
// domain's at node_rank * E*R), or in partial mode this domain's E*R columns only.
struct ProbsRow {
  int width;  // columns of the row
  int base;   // first column of this domain's E*R
};

__device__ __forceinline__ ProbsRow probs_row(const CombineParams& p) {
  if (p.partial) return {p.prob_cols, 0};
  return {p.prob_cols * p.domain.nodes, p.domain.node_rank * p.prob_cols};
}

// Where column `col` of a token's probs row comes from: the rank of this domain owning it and
// that rank's staged probs (`src` null for columns of other domains or past the row: always 0).
struct ProbSource {
  const float* src;
  int rank, local;
};

__device__ __forceinline__ ProbSource prob_source(const CombineParams& p, const Smem& s, int col,
                                                  ProbsRow row) {
  const int local = col - row.base;
  if (col >= row.width || local < 0 || local >= p.prob_cols) return {nullptr, 0, 0};
  const int j = local / p.experts_per_rank;
  return {s.prob_sources[j], j, local};
}

// The prob of a token from `from`, or 0 when the owning rank did not receive the token.
__device__ __forceinline__ float load_prob(const CombineParams& p, const ProbSource& from,
                                           const int32_t* rows) {
  if (from.src == nullptr || rows[from.rank] < 0) return 0.f;
  // From L2: written by another process (fused: during this kernel), never cached here.
  return __ldcg(from.src + int64_t(rows[from.rank]) * p.prob_cols + from.local);
}

// Column `col` of a probs row: at a float row, or (the eager form) in a record's tiles.
__device__ __forceinline__ float& prob_at(float* row, int col) { return row[col]; }
__device__ __forceinline__ float& prob_at(const TiledRow& row, int col) {
  return *reinterpret_cast<float*>(row.byte(int64_t(col) * 4));
}

// The probs row `dst` of a token: each receiving rank's own E columns, zeros elsewhere.
// `early_prob`: column `thread`'s, loaded before the wait.
template <class Row>
__device__ __forceinline__ void write_probs(const CombineParams& p, const Smem& s,
                                            const int32_t* rows, const Row& dst, float early_prob,
                                            int thread, int threads) {
  const ProbsRow row = probs_row(p);
  for (int col = thread; col < row.width; col += threads) {
    prob_at(dst, col) =
        col == thread ? early_prob : load_prob(p, prob_source(p, s, col, row), rows);
  }
}

// Hands the `count` stages from `first` on back to the loader.
__device__ __forceinline__ void release_stages(const Ring& ring, RingPos first, int count) {
  for (int k = 0; k < count; ++k) ring.release(first.plus(k, ring.stages).stage);
}

// Warp 0 of the reduce warps: s.starts of the chunk's `tokens` staged routes.
__device__ void count_chunk_copies(const Smem& s, const ChunkRoutes& routes, int tokens, int lane) {
  using WarpScan = cub::WarpScan<int>;
  __shared__ typename WarpScan::TempStorage scan;  // empty: the warp scan runs on shuffles
  int before = 0;
  for (int base = 0; base < tokens; base += 32) {
    const int k = base + lane;
    int start, all;
    WarpScan(scan).ExclusiveSum(k < tokens ? routes.copies(k) : 0, start, all);
    if (k < tokens) s.starts[k] = before + start;
    before += all;
  }
  if (lane == 0) s.starts[tokens] = before;
}

constexpr int kReduceThreads = 32 * kReduceWarps;

// Reduce warp `warp`'s units of one chunk, tokens [first, last) whose routes are staged in
// `routes` (and counted into s.starts): warp w owns pieces w, w + kReduceWarps, ... (token-
// major) and reduces them on its own, so no warp ever waits for another one except once per
// chunk, before the shared routes are replaced. A warp visits only its own pieces: walking
// every token to keep its ring position was a sixth of the kernel's instructions and a quarter
// of its stall samples at 2 ranks (ncu). `target` (several domains, first pass): where the
// partials go. kEager: the eager form's (combine_eager.cuh), its records in tiles; a kernel of
// its own, since the tiled writes in the signalled kernel made its combine 2-5 % slower (run
// s21f).
template <bool kEager>
__device__ __forceinline__ void reduce_chunk(const CombineParams& p, const Smem& s, Pass pass,
                                             const PassShape& shape, const ChunkRoutes& routes,
                                             int first, int last,
                                             const combine::PartialTarget& target,
                                             const ProbSource& lane_prob, ReduceCursor& cur,
                                             int warp, int lane) {
  const int piece_cols = p.hidden / shape.pieces;
  const int vectors = piece_cols / 8;
  const bool partial = p.partial && pass == Pass::kReduce;
  const size_t wire_bytes = p.across.bf16_wire ? 2 : 4;
  const bool with_probs = (partial ? p.across.partial_probs : p.out_probs) != nullptr;
  const Ring& ring = s.ring;
  const uint32_t in_chunk = uint32_t(s.starts[last - first]) * shape.pieces;
  // The loader's order: token by token, each token's pieces, each piece's copies.
  for (int unit = warp; unit < (last - first) * shape.pieces; unit += kReduceWarps) {
    const int at = shape.pieces == 1 ? unit : unit / shape.pieces;  // the token in the chunk
    const int piece = unit - at * shape.pieces;
    const int t = first + at;
    const int copies = s.starts[at + 1] - s.starts[at];
    // Ring position of the piece's first copy.
    const uint32_t item = cur.chunk_item + uint32_t(s.starts[at]) * shape.pieces + piece * copies;
    // Several domains: a token no rank here received has no partial (the final pass knows from
    // the maps), so nothing is written for it; most of the other domains' forwarded tokens are
    // such.
    if (partial && copies == 0) continue;
    const int32_t* rows = routes.token(t - first);
    const bool probs_here = with_probs && piece == 0;
    // Issue this lane's prob load before waiting, to hide it; fused with unpermute, only
    // after the waits (the loader's flag wait precedes its loads). The final pass takes its
    // probs from the partials.
    const bool fused = p.unpermute_blocks > 0;
    const bool rank_probs = probs_here && pass == Pass::kReduce;
    float early_prob = rank_probs && !fused ? load_prob(p, lane_prob, rows) : 0.f;
    cur.pos.advance_far(item - cur.pos_item, ring.stages);
    cur.pos_item = item;
    const RingPos first_copy = cur.pos;
    const CopyStages st{ring.base, ring.stride, ring.stages, first_copy.stage};
    if (copies > 0) {
      // Back off while waiting, so waiting warps leave the shared-memory pipe to others.
      while (*static_cast<volatile uint32_t*>(s.issued) < item + copies) __nanosleep(32);
    }
    for (int k = 0; k < copies; ++k) {  // copies <= width < stages: at most one wrap
      ring.wait(first_copy.plus(k, ring.stages));
    }
    if (rank_probs && fused) early_prob = load_prob(p, lane_prob, rows);
    const int64_t out_at = int64_t(t) * p.hidden + int64_t(piece) * piece_cols;
    // A single BF16 copy is its own sum: the TMA stores its stage as it is, and the warp holds
    // that stage until the store has read it.
    const bool by_tma = !partial && copies == 1 && !shape.fp32;
    // The eager form's records go to other domains; this domain's partials stay plain rows.
    const bool tiled = kEager && partial && target.tiled();
    if (tiled) {  // a record of the chunk's tiles at the peer
      const TiledRow dst = target.record_row(t, int64_t(piece) * piece_cols * int64_t(wire_bytes));
      if (p.across.bf16_wire) {
        sum_to_tiles(st, copies, vectors, shape.fp32, dst, lane);
      } else {
        sum_to_fp32(st, copies, vectors, shape.fp32, dst, lane);
      }
    } else if (partial) {  // several domains: the domain's partial, rounded once to the wire's
                           // width
      const int64_t to = int64_t(t - target.first_token) * p.hidden + int64_t(piece) * piece_cols;
      uint8_t* dst = target.rows + to * wire_bytes;
      if (p.across.bf16_wire) {
        sum_to_output(st, copies, vectors, shape.fp32, reinterpret_cast<uint4*>(dst), lane);
      } else {
        sum_to_fp32(st, copies, vectors, shape.fp32, reinterpret_cast<float*>(dst), lane);
      }
    } else if (by_tma) {
      if (lane == 0) {
        ptx::bulk_store(p.out + out_at, st.at(0), piece_cols * 2);
        ptx::bulk_commit();
      }
    } else if (copies > 0) {
      sum_to_output(st, copies, vectors, shape.fp32, reinterpret_cast<uint4*>(p.out + out_at),
                    lane);
    } else {  // no rank (or domain) received the token: its sum is zero
      for (int v = lane; v < vectors; v += 32) {
        reinterpret_cast<uint4*>(p.out + out_at)[v] = make_uint4(0, 0, 0, 0);
      }
    }
    __syncwarp();  // every lane is done reading the stages
    if (lane == 0) release_stages(ring, first_copy, by_tma ? 0 : copies);
    if (probs_here) {
      if (pass == Pass::kFinal) {
        combine::write_final_probs<kEager>(p, t, t / p.chunk, rows, lane, 32);
      } else if (tiled) {
        write_probs(p, s, rows, target.record_probs(t), early_prob, lane, 32);
      } else if (partial) {
        write_probs(p, s, rows, target.probs + int64_t(t - target.first_token) * p.prob_cols,
                    early_prob, lane, 32);
      } else {
        write_probs(p, s, rows, p.out_probs + int64_t(t) * probs_row(p).width, early_prob, lane,
                    32);
      }
    }
    if (lane == 0 && by_tma) {
      ptx::bulk_wait_read<0>();  // the bulk store has read the stage
      ring.release(first_copy.stage);
    }
  }
  cur.chunk_item += in_chunk;
}

// Reduce warps, final pass (several domains): own chunk j, each token's partials of the domains
// it went to added in ascending domain order into the BF16 output; then the chunk's ring slots
// are credited back to the other domains.
template <bool kEager>
__device__ __forceinline__ void reduce_partials(const CombineParams& p, const Smem& s, int j,
                                                ReduceCursor& cur, int warp, int lane) {
  const PassShape shape = pass_shape(p, s, Pass::kFinal);
  const ChunkRoutes routes{s.reduce_rows, shape.width};
  const int thread = warp * 32 + lane;
  const combine::OwnChunk own = combine::own_chunk(p, j);
  ptx::named_barrier(kReduceBarrier, kReduceThreads);  // done with the previous routes
  combine::stage_partial_routes(p, routes, own.first, own.last, thread, kReduceThreads);
  ptx::named_barrier(kReduceBarrier, kReduceThreads);
  if (warp == 0) {
    // The eager form: the other domains' entries become records (write_final_probs).
    if (kEager) combine::stage_eager_records(p, routes.rows, own.first, own.last, nullptr, lane);
    count_chunk_copies(s, routes, own.last - own.first, lane);
  }
  ptx::named_barrier(kReduceBarrier, kReduceThreads);
  reduce_chunk<kEager>(p, s, Pass::kFinal, shape, routes, own.first, own.last,
                       combine::PartialTarget{}, ProbSource{}, cur, warp, lane);
  __syncwarp();  // every lane has read its partials
  combine::credit_partials(p, s.finals, kReduceWarps, j, own.c, lane);
}

// Reduce warps: the walk step by step, as the loader. Every first-pass chunk; with several
// domains each warp counts each chunk done once its partials are written (for the network
// warps and the final pass), and the final passes come between them.
template <bool kEager>
__device__ __forceinline__ void reduce_walk(const CombineParams& p, const Smem& s,
                                            const ChunkWalk& walk, int warp, int lane) {
  const PassShape shape = pass_shape(p, s, Pass::kReduce);
  const ChunkRoutes routes{s.reduce_rows, shape.width};
  // This lane's column of the probs row, found once: per token, the division and the peer
  // table's global load sat in the chain every warp ran before waiting for its copies (ncu).
  const ProbSource lane_prob = prob_source(p, s, lane, probs_row(p));
  const int thread = warp * 32 + lane;
  WalkCursor at;
  const auto fetch = [&](HeldRoutes& held) {
    ChunkItem it;
    if (!walk.next_first(p, at, it)) return held.clear();
    held.fetch(p.sparse_to_dense_map, it.first, it.last, shape.width, thread, kReduceThreads);
  };
  ReduceCursor cur;
  HeldRoutes next;
  fetch(next);
  for (WalkStep step = walk.step(p, at); step.kind != WalkStep::kDone; step = walk.step(p, at)) {
    if (step.kind == WalkStep::kFinal) {
      reduce_partials<kEager>(p, s, step.own, cur, warp, lane);
      continue;
    }
    const ChunkItem& chunk = step.item;
    ptx::named_barrier(kReduceBarrier, kReduceThreads);  // done with the previous routes
    next.put(routes, thread, kReduceThreads);
    ptx::named_barrier(kReduceBarrier, kReduceThreads);
    fetch(next);
    if (warp == 0) {
      count_chunk_copies(s, routes, chunk.last - chunk.first, lane);
      // Several domains: the ring slot this chunk's partials go to is free; in the eager form
      // the tokens' records in it.
      if (p.partial) combine::wait_partial_slot(p, chunk, lane);
      if (kEager) {
        combine::number_records(s.records, routes, chunk.last - chunk.first, lane);
      }
    }
    ptx::named_barrier(kReduceBarrier, kReduceThreads);
    // Several domains: where this chunk's partials go (a mapped peer's ring, or here).
    const combine::PartialTarget target =
        p.partial ? combine::partial_target(p, chunk, s.records) : combine::PartialTarget{};
    reduce_chunk<kEager>(p, s, Pass::kReduce, shape, routes, chunk.first, chunk.last, target,
                         lane_prob, cur, warp, lane);
    if (p.partial) {
      // This warp's partials of the chunk are written (maybe into a peer, in another process,
      // or here, for the final pass's TMA loads): count it done; the network warps' signal
      // publishes them.
      ptx::fence_proxy_async_global();
      __threadfence_system();
      __syncwarp();
      if (lane == 0) atomicAdd(s.reduced, 1u);
    }
  }
}

// kEager: several domains in the eager form (p.across.eager).
template <bool kEager>
__global__ void __launch_bounds__(kThreads, 1) combine_kernel(CombineParams p) {
  // After a failed wait (e.g. the barrier before this kernel) peers' rows are not staged.
  if (p.domain.aborted()) return;
  extern __shared__ __align__(128) uint8_t smem[];
  const Smem s = carve(smem, p);
  const int warp = threadIdx.x / 32;
  for (int j = threadIdx.x; j < p.domain.ranks; j += blockDim.x) {
    s.sources[j] = staged_rows(p, j);
    s.prob_sources[j] = staged_probs(p, j);
  }
  if (p.partial) {
    for (int n = threadIdx.x; n < p.domain.nodes; n += blockDim.x) {
      s.partial_sources[n] = combine::partial_source(p, n);
    }
  }
  if (threadIdx.x == 0) {
    *s.issued = 0;
    *s.reduced = 0;
    *s.finals = 0;
    s.ring.init();
    if (kEager) {
      *s.epoch =
          EagerEpoch{reinterpret_cast<uint64_t*>(p.domain.self() + p.across.eager_epoch)}.take(
              int(gridDim.x));
    }
  }
  __syncthreads();
  // Fused, a block may unpermute its share first, then combine (inside one domain, every block
  // does both).
  if (p.unpermute_blocks > 0) {
    const int block = int(blockIdx.x) - p.first_unpermute_block;
    if (block >= 0) unpermute_units(p, block);
    if (int(blockIdx.x) >= p.combine_blocks) return;
  }
  const int lane = threadIdx.x % 32;
  const ChunkWalk walk = ChunkWalk::of(p);
  switch (role_of(warp)) {
    case Role::kLoader:
      load_walk<kEager>(p, s, walk, lane);
      break;
    case Role::kReduce:
      reduce_walk<kEager>(p, s, walk, reduce_warp_index(warp), lane);
      if (lane == 0) ptx::bulk_wait<0>();  // the warp's bulk stores are done before the end
      break;
    case Role::kNetwork:
      if (kEager) {
        combine::send_eager_partials(p, walk, s.reduced, kReduceWarps, *s.epoch,
                                     network_warp_index(warp), kNetworkWarps, lane);
      } else if (p.partial) {
        const int w = network_warp_index(warp);
        combine::send_reduced_chunks(p, walk, s.reduced, kReduceWarps,
                                     s.runs + w * run_count(p.chunk), w, kNetworkWarps, lane);
      }
      break;
  }
}

// The fused unpermute's consumer counters: the loaders waited for target = counter + 1 of every
// unit flag without moving it (several blocks wait for one unit).
__global__ void advance_unpermute_expected(CombineParams p) {
  const DomainView& d = p.domain;
  const int flags = int(p.unpermute.flags.count());
  for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < flags; k += gridDim.x * blockDim.x) {
    ++*d.expected_for(p.unpermute.flags.nth(k));
  }
}

}  // namespace

// The ring's shared memory per stage and the rest, from the plan the kernel carves with.
size_t combine_stage_bytes(const CombineParams& p) {
  return SmemPlan::stage_bytes(stage_stride(p));
}

size_t combine_reserved_smem(int chunk, int ranks, int nodes, bool eager) {
  return SmemParts::make(0, 0, ranks, nodes, chunk, eager).plan.reserved();
}

int combine_chunk_of(int nodes, int dispatch_chunk, int combine_chunk) {
  return nodes > 1 ? dispatch_chunk : combine_chunk;
}

void launch_combine(const CombineParams& p, cudaStream_t stream) {
  const size_t smem = SmemParts::of(p).plan.bytes();
  const auto kernel = p.partial && p.across.eager ? combine_kernel<true> : combine_kernel<false>;
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  // Without unpermute blocks this is combine_blocks.
  const int grid = std::max(p.combine_blocks, p.first_unpermute_block + p.unpermute_blocks);
  kernel<<<grid, kThreads, smem, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
  if (p.unpermute_blocks > 0) {
    advance_unpermute_expected<<<1, 256, 0, stream>>>(p);
    HYBRID_EP_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace hybrid_ep

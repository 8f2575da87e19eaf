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

#include "hybrid_ep/kernels/combine_across.cuh"
#include "hybrid_ep/kernels/combine_sum.cuh"
#include "hybrid_ep/kernels/combine_unpermute.cuh"
#include "hybrid_ep/kernels/common/chunk_routes.cuh"
#include "hybrid_ep/kernels/common/launch.h"
#include "hybrid_ep/kernels/common/ptx.cuh"
#include "hybrid_ep/kernels/common/ring_pos.cuh"
#include "hybrid_ep/kernels/params.h"
#include "hybrid_ep/runtime/cuda_check.h"

namespace hybrid_ep {
namespace {

using combine::ChunkItem;
using combine::ChunkWalk;

// Six: with two-copy tokens the ring holds 8 of them, so 8 warps each waited for its next
// token's loads to be issued and land after its sum; with fewer, a warp's next token is often in
// already. 2 ranks x 8 SMs (benchmarks/results/2026-12-01-held-routes.md): 4 warps 251.5 us,
// 5 236.4, 6 233.5, 7 233.0, 8 237.9; one rank 159.0-165.0, 6 the fastest.
constexpr int kReduceWarps = 6;
// The two warps past the loader and the reduce warps send the reduced chunks between domains
// (they would be idle otherwise: the block keeps 9 warps because, fused with unpermute, every
// warp unpermutes first; with 7 the fused op took 248 instead of 216 us at one rank, 1116
// instead of 890 at two).
constexpr int kNetworkWarps = 2;
constexpr int kThreads = 32 * (1 + kReduceWarps + kNetworkWarps);
constexpr uint32_t kReduceBarrier = 1;

enum class Role { kLoader, kReduce, kNetwork };

__device__ __forceinline__ Role role_of(int warp) {
  if (warp == 0) return Role::kLoader;
  return warp <= kReduceWarps ? Role::kReduce : Role::kNetwork;
}
__device__ __forceinline__ int reduce_warp_index(int warp) { return warp - 1; }
__device__ __forceinline__ int network_warp_index(int warp) { return warp - 1 - kReduceWarps; }

__host__ __device__ constexpr int align_up(int v, int a) { return (v + a - 1) / a * a; }

// Bytes of one copy's piece in the registered buffer (BF16 or fp32 input columns).
__host__ __device__ inline int piece_bytes(const CombineParams& p) {
  return p.hidden / p.pieces * (p.fp32_input ? 4 : 2);
}

// With several domains the final pass pulls partials through the same ring: a piece of one at
// the wire's width.
__host__ __device__ inline int final_piece_bytes(const CombineParams& p) {
  return p.partial ? p.hidden / p.pieces * (p.across.bf16_wire ? 2 : 4) : 0;
}

// Sources per token: the domain's ranks, and with several domains the domains (final pass).
__host__ __device__ inline int ring_width(const CombineParams& p) {
  return p.partial ? max(p.domain.ranks, p.domain.nodes) : p.domain.ranks;
}

// A stage holds one copy of a piece's columns. The copies' probs are not staged: the reduce
// warps' lanes load them before waiting for the stages. Staged (one more small TMA load per
// copy), the kernel took 370 instead of 322 us at 2 ranks x 8 SMs (194 vs 185 at 1 rank; the
// same 236 us fused with unpermute).
__host__ __device__ inline int stage_stride(const CombineParams& p) {
  return align_up(max(piece_bytes(p), final_piece_bytes(p)), 128);
}

struct Ring {
  uint8_t* rows;
  // [ranks]: where each local rank's staged combine rows start (staged_rows). Read from the
  // peer table in global memory instead, the loader lane's chain waited on that load for every
  // copy it issued, and the reduce warps waited for the loader (ncu, 2 ranks).
  const uint8_t** sources;
  // [nodes] with several domains: where each domain's partials of this rank's tokens are.
  const uint8_t** partial_sources;
  uint64_t* full;
  uint64_t* empty;
  int32_t* loader_rows;  // the roles' staged routes, [chunk, ring_width] each
  int32_t* reduce_rows;
  int stages;
  int stride;
  // Items the loader has issued. Reduce warps run ahead of each other, so one may want an item
  // more than a ring round ahead of the loader, where a parity wait on its stage would see the
  // previous round complete; waiting for the issue first makes the parity unambiguous.
  uint32_t* issued;
  // [chunk + 1]: copies of the reduce warps' current chunk before each token (the last entry:
  // all of them), so that a warp finds its pieces' ring positions without walking the others.
  int32_t* starts;
  // Several domains: chunks the reduce warps have finished (each warp counts each chunk), which
  // the network warps and the final pass wait on; and the network warps' run scratch.
  uint32_t* reduced;
  TokenRun* runs;
  __device__ uint8_t* row(int stage) const { return rows + size_t(stage) * stride; }
};

// The block's shared memory, one plan for the carve and the size: the ring's stages and
// barriers, then the sources, both roles' routes, the copy counts, the counters and (several
// domains: `network`) the partial sources and the network warps' runs.
struct SmemPlan {
  int stride, stages, ranks, nodes, chunk;
  size_t full, empty, sources, partial_sources, routes, starts, issued, reduced, runs, bytes;

  __host__ __device__ static int run_count(int chunk) { return (chunk + 1) / 2; }

  __host__ __device__ static SmemPlan make(int stride, int stages, int ranks, int nodes,
                                           int chunk) {
    const bool network = nodes > 1;
    const int width = network ? max(ranks, nodes) : ranks;
    SmemPlan m{stride, stages, ranks, nodes, chunk};
    m.full = size_t(stride) * stages;
    m.empty = m.full + sizeof(uint64_t) * stages;
    m.sources = m.empty + sizeof(uint64_t) * stages;
    m.partial_sources = m.sources + sizeof(uint8_t*) * ranks;
    m.routes = m.partial_sources + (network ? sizeof(uint8_t*) * nodes : 0);
    m.starts = m.routes + 2 * sizeof(int32_t) * size_t(chunk) * width;
    m.issued = m.starts + sizeof(int32_t) * size_t(chunk + 1);
    m.reduced = m.issued + sizeof(uint32_t);
    m.runs = (m.reduced + sizeof(uint32_t) + 7) / 8 * 8;
    m.bytes = m.runs + (network ? sizeof(TokenRun) * size_t(run_count(chunk)) * kNetworkWarps : 0);
    return m;
  }
  // Everything but the stages and their barriers.
  __host__ __device__ size_t reserved() const { return bytes - sources; }
};

__host__ __device__ inline SmemPlan smem_plan(const CombineParams& p) {
  return SmemPlan::make(stage_stride(p), p.stages, p.domain.ranks, p.partial ? p.domain.nodes : 1,
                        p.chunk);
}

__device__ __forceinline__ Ring carve_ring(uint8_t* smem, const CombineParams& p) {
  const SmemPlan m = smem_plan(p);
  Ring ring;
  ring.stages = p.stages;
  ring.stride = m.stride;
  ring.rows = smem;
  ring.full = reinterpret_cast<uint64_t*>(smem + m.full);
  ring.empty = reinterpret_cast<uint64_t*>(smem + m.empty);
  ring.sources = reinterpret_cast<const uint8_t**>(smem + m.sources);
  ring.partial_sources = reinterpret_cast<const uint8_t**>(smem + m.partial_sources);
  ring.loader_rows = reinterpret_cast<int32_t*>(smem + m.routes);
  ring.reduce_rows = ring.loader_rows + p.chunk * ring_width(p);
  ring.starts = reinterpret_cast<int32_t*>(smem + m.starts);
  ring.issued = reinterpret_cast<uint32_t*>(smem + m.issued);
  ring.reduced = reinterpret_cast<uint32_t*>(smem + m.reduced);
  ring.runs = reinterpret_cast<TokenRun*>(smem + m.runs);
  return ring;
}

// Where local rank j's staged rows and probs are: its registered combine region, or inside one
// domain for this rank itself the caller's input (CombineParams::own_rows).
__device__ __forceinline__ const uint8_t* staged_rows(const CombineParams& p, int j) {
  if (j == p.domain.local_rank && p.own_rows != nullptr) return p.own_rows;
  return p.domain.peer(j) + p.combine_rows;
}

__device__ __forceinline__ const float* staged_probs(const CombineParams& p, int j) {
  if (j == p.domain.local_rank && p.own_rows != nullptr) return p.own_probs;
  return reinterpret_cast<const float*>(p.domain.peer(j) + p.combine_probs);
}

// The two passes of the loader and the reduce warps over the ring. kReduce: every chunk of the
// walk, each token's copies from the domain's ranks; with several domains (kFinal, after it)
// this rank's own chunks, each token's partials from the domains it went to.
enum class Pass { kReduce, kFinal };

// What a pass pulls per token: `width` sources (ChunkRoutes::ranks) of pieces of
// `piece_bytes`, fp32 or BF16, from `sources[j] + row * row_bytes`.
struct PassShape {
  int width;
  int pieces;
  int piece_bytes;
  bool fp32;
  const uint8_t* const* sources;
  __device__ int64_t row_bytes() const { return int64_t(piece_bytes) * pieces; }
};

__device__ __forceinline__ PassShape pass_shape(const CombineParams& p, const Ring& ring,
                                                Pass pass) {
  if (pass == Pass::kReduce) {
    return {p.domain.ranks, p.pieces, piece_bytes(p), p.fp32_input, ring.sources};
  }
  return {p.domain.nodes, p.pieces, final_piece_bytes(p), !p.across.bf16_wire,
          ring.partial_sources};
}

// The ring positions a role carries from chunk to chunk and from the first pass to the second.
struct LoaderCursor {
  uint32_t item = 0;
  RingPos at{0, 0};  // of `item`, the same on every lane
};

struct ReduceCursor {
  uint32_t chunk_item = 0;  // ring position of the chunk's first copy
  // The stage and parity of ring item `pos_item`, moved forward from unit to unit (a division
  // per unit was another link of the chain every warp runs before its wait).
  RingPos pos{0, 0};
  uint32_t pos_item = 0;
};

// The loader's copies of the tokens [first, last) whose routes are staged in `routes`: one
// piece of a token at once, one lane per source: each present lane finds its copy's stage from
// the sources before it, waits for that stage and issues its TMA load. Issued copy by copy from
// lane 0, each copy's chain (route and source loads, the wait, the issue) bounded the combine
// at two ranks x 8 SMs (ncu: the reduce warps waited on the issue counter while the loader
// seldom waited for a free stage); one chain per token took it from 233 to 208 us
// (benchmarks/results/2026-12-01-combine-loader.md).
__device__ __forceinline__ void issue_copies(const Ring& ring, const PassShape& shape,
                                             const ChunkRoutes& routes, int first, int last,
                                             LoaderCursor& cur, int lane) {
  const uint32_t lanes_before = (1u << lane) - 1;
  for (int t = first; t < last; ++t) {
    const int32_t* rows = routes.token(t - first);
    for (int piece = 0; piece < shape.pieces; ++piece) {
      for (int j0 = 0; j0 < shape.width; j0 += 32) {  // sources past 32: 32 at a time
        const int j = j0 + lane;
        const int32_t row = j < shape.width ? rows[j] : -1;
        const uint32_t present = __ballot_sync(~0u, row >= 0);
        if (row >= 0) {
          RingPos mine = cur.at;  // copies <= width <= stages: at most one wrap
          mine.advance(__popc(present & lanes_before), ring.stages);
          ptx::mbar_wait(&ring.empty[mine.stage], mine.phase ^ 1);
          ptx::mbar_arrive_expect_tx(&ring.full[mine.stage], shape.piece_bytes);
          ptx::bulk_load(
              ring.row(mine.stage),
              shape.sources[j] + row * shape.row_bytes() + int64_t(piece) * shape.piece_bytes,
              shape.piece_bytes, &ring.full[mine.stage]);
        }
        const int copies = __popc(present);
        cur.item += copies;
        cur.at.advance(copies, ring.stages);
        __syncwarp();  // every lane has issued its load
        if (lane == 0) *static_cast<volatile uint32_t*>(ring.issued) = cur.item;
      }
    }
  }
}

// Loader warp, first pass: stages each chunk's routes (the next chunk's are loaded into
// registers meanwhile) and issues its copies.
__device__ void load_copies(const CombineParams& p, const Ring& ring, const ChunkWalk& walk,
                            LoaderCursor& cur, int lane) {
  const PassShape shape = pass_shape(p, ring, Pass::kReduce);
  const ChunkRoutes routes{ring.loader_rows, shape.width};
  const auto fetch = [&](HeldRoutes& held, int k) {
    if (k >= walk.items) return held.clear();
    const ChunkItem it = walk.at(p, k);
    held.fetch(p.sparse_to_dense_map, it.first, it.last, shape.width, lane, 32);
  };
  HeldRoutes next;
  fetch(next, 0);
  for (int k = 0; k < walk.items; ++k) {
    const ChunkItem chunk = walk.at(p, k);
    __syncwarp();  // every lane is done with the previous chunk's routes
    next.put(routes, lane, 32);
    fetch(next, k + 1);
    // After a failed wait the stages are loaded anyway: the reduce warps must finish, and the
    // abort word makes the call report instead of returning what it read.
    if (p.unpermute_blocks > 0 && lane == 0) wait_unpermuted(p, chunk.first, chunk.last);
    __syncwarp();
    issue_copies(ring, shape, routes, chunk.first, chunk.last, cur, lane);
  }
}

// Loader warp, final pass (several domains): per own chunk, once this block's partials of it
// are written and every other domain's have arrived, the partials of each token.
__device__ void load_partials(const CombineParams& p, const Ring& ring, const ChunkWalk& walk,
                              LoaderCursor& cur, int lane) {
  const PassShape shape = pass_shape(p, ring, Pass::kFinal);
  const ChunkRoutes routes{ring.loader_rows, shape.width};
  for (int k = 0; k < walk.per_domain; ++k) {
    const combine::OwnChunk own = combine::own_chunk(p, k);
    if (lane == 0) {
      combine::wait_partials(p, ring.reduced, kReduceWarps * (walk.sent(p) + k + 1), own.c);
    }
    __syncwarp();  // every lane is done with the previous chunk's routes
    combine::stage_partial_routes(p, routes, own.first, own.last, lane, 32);
    __syncwarp();
    issue_copies(ring, shape, routes, own.first, own.last, cur, lane);
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

__device__ __forceinline__ ProbSource prob_source(const CombineParams& p, int col, ProbsRow row) {
  const int local = col - row.base;
  if (col >= row.width || local < 0 || local >= p.prob_cols) return {nullptr, 0, 0};
  const int j = local / p.experts_per_rank;
  return {staged_probs(p, j), j, local};
}

// The prob of a token from `from`, or 0 when the owning rank did not receive the token.
__device__ __forceinline__ float load_prob(const CombineParams& p, const ProbSource& from,
                                           const int32_t* rows) {
  if (from.src == nullptr || rows[from.rank] < 0) return 0.f;
  // From L2: written by another process (fused: during this kernel), never cached here.
  return __ldcg(from.src + int64_t(rows[from.rank]) * p.prob_cols + from.local);
}

// The probs row `dst` of a token: each receiving rank's own E columns, zeros elsewhere.
// `early_prob`: column `thread`'s, loaded before the wait.
__device__ __forceinline__ void write_probs(const CombineParams& p, const int32_t* rows, float* dst,
                                            float early_prob, int thread, int threads) {
  const ProbsRow row = probs_row(p);
  for (int col = thread; col < row.width; col += threads) {
    dst[col] = col == thread ? early_prob : load_prob(p, prob_source(p, col, row), rows);
  }
}

// Hands stages first + [from, to) of the ring back to the loader.
__device__ __forceinline__ void release_stages(const Ring& ring, int first, int from, int to) {
  for (int k = from; k < to; ++k) {
    const int s = first + k;
    ptx::mbar_arrive(&ring.empty[s < ring.stages ? s : s - ring.stages]);
  }
}

// Warp 0 of the reduce warps: ring.starts of the chunk's `tokens` staged routes.
__device__ void count_chunk_copies(const Ring& ring, const ChunkRoutes& routes, int tokens,
                                   int lane) {
  using WarpScan = cub::WarpScan<int>;
  __shared__ typename WarpScan::TempStorage scan;  // empty: the warp scan runs on shuffles
  int before = 0;
  for (int base = 0; base < tokens; base += 32) {
    const int k = base + lane;
    int start, all;
    WarpScan(scan).ExclusiveSum(k < tokens ? routes.copies(k) : 0, start, all);
    if (k < tokens) ring.starts[k] = before + start;
    before += all;
  }
  if (lane == 0) ring.starts[tokens] = before;
}

constexpr int kReduceThreads = 32 * kReduceWarps;

// Reduce warp `warp`'s units of one chunk, tokens [first, last) whose routes are staged in
// `routes` (and counted into ring.starts): warp w owns pieces w, w + kReduceWarps, ... (token-
// major) and reduces them on its own, so no warp ever waits for another one except once per
// chunk, before the shared routes are replaced. A warp visits only its own pieces: walking
// every token to keep its ring position was a sixth of the kernel's instructions and a quarter
// of its stall samples at 2 ranks (ncu). `target` (several domains, first pass): where the
// partials go.
__device__ __forceinline__ void reduce_chunk(const CombineParams& p, const Ring& ring, Pass pass,
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
  const uint32_t in_chunk = uint32_t(ring.starts[last - first]) * shape.pieces;
  // The loader's order: token by token, each token's pieces, each piece's copies.
  for (int unit = warp; unit < (last - first) * shape.pieces; unit += kReduceWarps) {
    const int at = shape.pieces == 1 ? unit : unit / shape.pieces;  // the token in the chunk
    const int piece = unit - at * shape.pieces;
    const int t = first + at;
    const int copies = ring.starts[at + 1] - ring.starts[at];
    // Ring position of the piece's first copy.
    const uint32_t item =
        cur.chunk_item + uint32_t(ring.starts[at]) * shape.pieces + piece * copies;
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
    const CopyStages st{ring.rows, ring.stride, ring.stages, cur.pos.stage};
    const uint32_t parity = cur.pos.phase;
    if (copies > 0) {
      // Back off while waiting, so waiting warps leave the shared-memory pipe to others.
      while (*static_cast<volatile uint32_t*>(ring.issued) < item + copies) __nanosleep(32);
    }
    for (int k = 0; k < copies; ++k) {  // copies <= width < stages: at most one wrap
      const int s = st.first + k;
      ptx::mbar_wait(&ring.full[s < ring.stages ? s : s - ring.stages],
                     s < ring.stages ? parity : parity ^ 1);
    }
    if (rank_probs && fused) early_prob = load_prob(p, lane_prob, rows);
    const int64_t out_at = int64_t(t) * p.hidden + int64_t(piece) * piece_cols;
    // A single BF16 copy is its own sum: the TMA stores its stage as it is, and the warp holds
    // that stage until the store has read it.
    const bool by_tma = !partial && copies == 1 && !shape.fp32;
    if (partial) {  // several domains: the domain's partial, rounded once to the wire's width
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
    if (lane == 0) release_stages(ring, st.first, 0, by_tma ? 0 : copies);
    if (probs_here) {
      if (pass == Pass::kFinal) {
        combine::write_final_probs(p, t, lane, 32);
      } else if (partial) {
        write_probs(p, rows, target.probs + int64_t(t - target.first_token) * p.prob_cols,
                    early_prob, lane, 32);
      } else {
        write_probs(p, rows, p.out_probs + int64_t(t) * probs_row(p).width, early_prob, lane, 32);
      }
    }
    if (lane == 0 && by_tma) {
      ptx::bulk_wait_read<0>();  // the bulk store has read the stage
      release_stages(ring, st.first, 0, 1);
    }
  }
  cur.chunk_item += in_chunk;
}

// Reduce warps, first pass: every chunk of the walk. With several domains each warp counts each
// chunk done once its partials are written (for the network warps and the final pass).
__device__ void reduce_copies(const CombineParams& p, const Ring& ring, const ChunkWalk& walk,
                              ReduceCursor& cur, int warp, int lane) {
  const PassShape shape = pass_shape(p, ring, Pass::kReduce);
  const ChunkRoutes routes{ring.reduce_rows, shape.width};
  // This lane's column of the probs row, found once: per token, the division and the peer
  // table's global load sat in the chain every warp ran before waiting for its copies (ncu).
  const ProbSource lane_prob = prob_source(p, lane, probs_row(p));
  const int thread = warp * 32 + lane;
  const auto fetch = [&](HeldRoutes& held, int k) {
    if (k >= walk.items) return held.clear();
    const ChunkItem it = walk.at(p, k);
    held.fetch(p.sparse_to_dense_map, it.first, it.last, shape.width, thread, kReduceThreads);
  };
  HeldRoutes next;
  fetch(next, 0);
  for (int k = 0; k < walk.items; ++k) {
    const ChunkItem chunk = walk.at(p, k);
    ptx::named_barrier(kReduceBarrier, kReduceThreads);  // done with the previous routes
    next.put(routes, thread, kReduceThreads);
    ptx::named_barrier(kReduceBarrier, kReduceThreads);
    fetch(next, k + 1);
    if (warp == 0) count_chunk_copies(ring, routes, chunk.last - chunk.first, lane);
    ptx::named_barrier(kReduceBarrier, kReduceThreads);
    // Several domains: where this chunk's partials go (a mapped peer's tile, or here).
    const combine::PartialTarget target =
        p.partial ? combine::partial_target(p, chunk) : combine::PartialTarget{};
    reduce_chunk(p, ring, Pass::kReduce, shape, routes, chunk.first, chunk.last, target, lane_prob,
                 cur, warp, lane);
    if (p.partial) {
      // This warp's partials of the chunk are written (maybe into a peer, in another process,
      // or here, for the final pass's TMA loads): count it done; the network warps' signal
      // publishes them.
      ptx::fence_proxy_async_global();
      __threadfence_system();
      __syncwarp();
      if (lane == 0) atomicAdd(ring.reduced, 1u);
    }
  }
}

// Reduce warps, final pass (several domains): this rank's own chunks, each token's partials of
// the domains it went to added in ascending domain order into the BF16 output.
__device__ void reduce_partials(const CombineParams& p, const Ring& ring, const ChunkWalk& walk,
                                ReduceCursor& cur, int warp, int lane) {
  const PassShape shape = pass_shape(p, ring, Pass::kFinal);
  const ChunkRoutes routes{ring.reduce_rows, shape.width};
  const int thread = warp * 32 + lane;
  for (int k = 0; k < walk.per_domain; ++k) {
    const combine::OwnChunk own = combine::own_chunk(p, k);
    ptx::named_barrier(kReduceBarrier, kReduceThreads);  // done with the previous routes
    combine::stage_partial_routes(p, routes, own.first, own.last, thread, kReduceThreads);
    ptx::named_barrier(kReduceBarrier, kReduceThreads);
    if (warp == 0) count_chunk_copies(ring, routes, own.last - own.first, lane);
    ptx::named_barrier(kReduceBarrier, kReduceThreads);
    reduce_chunk(p, ring, Pass::kFinal, shape, routes, own.first, own.last,
                 combine::PartialTarget{}, ProbSource{}, cur, warp, lane);
  }
}

__global__ void __launch_bounds__(kThreads, 1) combine_kernel(CombineParams p) {
  // After a failed wait (e.g. the barrier before this kernel) peers' rows are not staged.
  if (p.domain.aborted()) return;
  extern __shared__ __align__(128) uint8_t smem[];
  const Ring ring = carve_ring(smem, p);
  const int warp = threadIdx.x / 32;
  for (int j = threadIdx.x; j < p.domain.ranks; j += blockDim.x) {
    ring.sources[j] = staged_rows(p, j);
  }
  if (p.partial) {
    for (int n = threadIdx.x; n < p.domain.nodes; n += blockDim.x) {
      ring.partial_sources[n] = combine::partial_source(p, n);
    }
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < ring.stages; ++s) {
      ptx::mbar_init(&ring.full[s], 1);
      ptx::mbar_init(&ring.empty[s], 1);
    }
    *ring.issued = 0;
    *ring.reduced = 0;
    ptx::fence_barrier_init();
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
    case Role::kLoader: {
      LoaderCursor cur;
      load_copies(p, ring, walk, cur, lane);
      if (p.partial) load_partials(p, ring, walk, cur, lane);
      break;
    }
    case Role::kReduce: {
      ReduceCursor cur;
      reduce_copies(p, ring, walk, cur, reduce_warp_index(warp), lane);
      if (p.partial) reduce_partials(p, ring, walk, cur, reduce_warp_index(warp), lane);
      if (lane == 0) ptx::bulk_wait<0>();  // the warp's bulk stores are done before the end
      break;
    }
    case Role::kNetwork:
      if (p.partial) {
        const int w = network_warp_index(warp);
        combine::send_reduced_chunks(p, walk, ring.reduced, kReduceWarps,
                                     ring.runs + w * SmemPlan::run_count(p.chunk), w, kNetworkWarps,
                                     lane);
      }
      break;
  }
}

// The fused unpermute's consumer counters: the loaders waited for target = counter + 1 of every
// unit flag without moving it (several blocks wait for one unit).
__global__ void advance_unpermute_expected(CombineParams p) {
  const DomainView& d = p.domain;
  const int flags = d.ranks * d.nodes * p.unpermute.max_chunks * p.unpermute.slices;
  for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < flags; k += gridDim.x * blockDim.x) {
    ++*d.expected_for(p.unpermute.flags + sizeof(uint64_t) * k);
  }
}

}  // namespace

// The ring's shared memory per stage and the rest, from the plan the kernel carves with.
size_t combine_stage_bytes(const CombineParams& p) {
  return stage_stride(p) + 2 * sizeof(uint64_t);
}

size_t combine_reserved_smem(int chunk, int ranks, int nodes) {
  return SmemPlan::make(0, 0, ranks, nodes, chunk).reserved();
}

int combine_chunk_of(int nodes, int dispatch_chunk, int combine_chunk) {
  return nodes > 1 ? dispatch_chunk : combine_chunk;
}

void launch_combine(const CombineParams& p, cudaStream_t stream) {
  const size_t smem = smem_plan(p).bytes;
  allow_dynamic_smem(reinterpret_cast<const void*>(combine_kernel), smem);
  // Without unpermute blocks this is combine_blocks.
  const int grid = std::max(p.combine_blocks, p.first_unpermute_block + p.unpermute_blocks);
  combine_kernel<<<grid, kThreads, smem, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
  if (p.unpermute_blocks > 0) {
    advance_unpermute_expected<<<1, 256, 0, stream>>>(p);
    HYBRID_EP_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace hybrid_ep

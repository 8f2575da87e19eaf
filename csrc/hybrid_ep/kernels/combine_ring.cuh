// The combine kernel's shape (combine.cu): its warp roles, the plan of the block's shared memory
// (the ring of staged pieces and the roles' state), and the two passes the loader and the
// reduce warps make over that ring.
#pragma once

#include <cstdint>

#include "hybrid_ep/kernels/common/ring.cuh"
#include "hybrid_ep/kernels/common/ring_pos.cuh"
#include "hybrid_ep/kernels/common/smem_plan.h"
#include "hybrid_ep/kernels/network_send.cuh"
#include "hybrid_ep/kernels/params.h"

namespace hybrid_ep {
namespace combine {

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

// Bytes of a partial row between domains (several domains): the wire's width.
__host__ __device__ __forceinline__ size_t partial_row_bytes(const CombineParams& p) {
  return size_t(p.hidden) * (p.across.bf16_wire ? 2 : 4);
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

__host__ __device__ constexpr int run_count(int chunk) { return (chunk + 1) / 2; }

// The block's shared memory, one plan for the carve and the size: the ring, then the sources,
// both roles' routes, the copy counts, the counters, (several domains: `network`) the partial
// sources and the network warps' runs, and (the eager form) its records and epoch.
struct SmemParts {
  SmemPlan plan;
  size_t sources = 0, prob_sources = 0, partial_sources = 0, routes = 0, starts = 0, issued = 0,
         reduced = 0, finals = 0, runs = 0, records = 0, landed = 0, domain_records = 0, epoch = 0;

  __host__ __device__ static SmemParts make(int stride, int stages, int ranks, int nodes, int chunk,
                                            bool eager) {
    const bool network = nodes > 1;
    const int width = network ? max(ranks, nodes) : ranks;
    SmemParts m{SmemPlan(stride, stages)};
    m.sources = m.plan.place<const uint8_t*>(ranks);
    m.prob_sources = m.plan.place<const float*>(ranks);
    m.partial_sources = m.plan.place<const uint8_t*>(network ? nodes : 0);
    m.routes = m.plan.place<int32_t>(2 * size_t(chunk) * width);
    m.starts = m.plan.place<int32_t>(size_t(chunk) + 1);
    m.issued = m.plan.place<uint32_t>(1);
    m.reduced = m.plan.place<uint32_t>(1);
    m.finals = m.plan.place<uint32_t>(1);
    m.runs = m.plan.place<TokenRun>(network ? size_t(run_count(chunk)) * kNetworkWarps : 0,
                                    sizeof(TokenRun));  // aligned to a run's 8 bytes
    const bool tiles = network && eager;
    m.records = m.plan.place<int32_t>(tiles ? size_t(chunk) : 0);
    m.landed = m.plan.place<int32_t>(tiles ? size_t(nodes) : 0);
    m.domain_records = m.plan.place<int32_t>(tiles ? size_t(nodes) : 0);
    m.epoch = m.plan.place<uint64_t>(tiles ? 1 : 0, sizeof(uint64_t));
    return m;
  }
  __host__ __device__ static SmemParts of(const CombineParams& p) {
    return make(stage_stride(p), p.stages, p.domain.ranks, p.partial ? p.domain.nodes : 1, p.chunk,
                p.partial && p.across.eager);
  }
};

struct Smem {
  Ring ring;
  // [ranks]: where each local rank's staged combine rows start (staged_rows). Read from the
  // peer table in global memory instead, the loader lane's chain waited on that load for every
  // copy it issued, and the reduce warps waited for the loader (ncu, 2 ranks).
  const uint8_t** sources;
  const float** prob_sources;  // [ranks]: the same for their staged probs (staged_probs)
  // [nodes] with several domains: where each domain's partials of this rank's tokens are.
  const uint8_t** partial_sources;
  int32_t* loader_rows;  // the roles' staged routes, [chunk, ring_width] each
  int32_t* reduce_rows;
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
  uint32_t* finals;  // several domains: reduce warps done with final-pass chunks (credits)
  TokenRun* runs;
  // The eager form (combine_eager.cuh): [chunk] the record of each token of the reduce warps'
  // chunk in its slot (-1: none); [nodes] the loader's tiles seen and records of each domain's
  // slot of its own chunk; the kernel's epoch.
  int32_t* records;
  int32_t* landed;
  int32_t* domain_records;
  uint64_t* epoch;
};

__device__ __forceinline__ Smem carve(uint8_t* smem, const CombineParams& p) {
  const SmemParts m = SmemParts::of(p);
  Smem s;
  s.ring = Ring::carve(smem, m.plan);
  s.sources = reinterpret_cast<const uint8_t**>(smem + m.sources);
  s.prob_sources = reinterpret_cast<const float**>(smem + m.prob_sources);
  s.partial_sources = reinterpret_cast<const uint8_t**>(smem + m.partial_sources);
  s.loader_rows = reinterpret_cast<int32_t*>(smem + m.routes);
  s.reduce_rows = s.loader_rows + p.chunk * ring_width(p);
  s.starts = reinterpret_cast<int32_t*>(smem + m.starts);
  s.issued = reinterpret_cast<uint32_t*>(smem + m.issued);
  s.reduced = reinterpret_cast<uint32_t*>(smem + m.reduced);
  s.finals = reinterpret_cast<uint32_t*>(smem + m.finals);
  s.runs = reinterpret_cast<TokenRun*>(smem + m.runs);
  s.records = reinterpret_cast<int32_t*>(smem + m.records);
  s.landed = reinterpret_cast<int32_t*>(smem + m.landed);
  s.domain_records = reinterpret_cast<int32_t*>(smem + m.domain_records);
  s.epoch = reinterpret_cast<uint64_t*>(smem + m.epoch);
  return s;
}

// Where local rank j's staged rows and probs are: its registered combine region, or inside one
// domain wherever it published them (a zero-copy pool block) and for this rank itself the
// caller's input (CombineParams::own_rows). Read once per block into shared memory.
__device__ __forceinline__ const uint8_t* staged_rows(const CombineParams& p, int j) {
  if (j == p.domain.local_rank && p.own_rows != nullptr) return p.own_rows;
  const uint8_t* peer = p.domain.peer(j);
  if (p.published_sources) {
    return peer + reinterpret_cast<const volatile uint64_t*>(
                      peer + p.receive_targets)[ReceiveTargets::kCombineRows];
  }
  return peer + p.combine_rows;
}

__device__ __forceinline__ const float* staged_probs(const CombineParams& p, int j) {
  if (j == p.domain.local_rank && p.own_rows != nullptr) return p.own_probs;
  const uint8_t* peer = p.domain.peer(j);
  if (p.published_sources) {
    return reinterpret_cast<const float*>(
        peer + reinterpret_cast<const volatile uint64_t*>(
                   peer + p.receive_targets)[ReceiveTargets::kCombineProbs]);
  }
  return reinterpret_cast<const float*>(peer + p.combine_probs);
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

__device__ __forceinline__ PassShape pass_shape(const CombineParams& p, const Smem& s, Pass pass) {
  if (pass == Pass::kReduce) {
    return {p.domain.ranks, p.pieces, piece_bytes(p), p.fp32_input, s.sources};
  }
  return {p.domain.nodes, p.pieces, final_piece_bytes(p), !p.across.bf16_wire, s.partial_sources};
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

}  // namespace combine
}  // namespace hybrid_ep

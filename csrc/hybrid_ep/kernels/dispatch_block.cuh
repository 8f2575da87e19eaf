// The dispatch kernel's shape (dispatch.cu): its warp roles, what a ring stage holds, where
// each local rank's rows land, and the plan of the block's shared memory.
#pragma once

#include <cstdint>

#include "hybrid_ep/kernels/common/chunk_routes.cuh"
#include "hybrid_ep/kernels/common/ring.cuh"
#include "hybrid_ep/kernels/common/smem_plan.h"
#include "hybrid_ep/kernels/common/token_runs.cuh"
#include "hybrid_ep/kernels/params.h"
#include "hybrid_ep/transport/eager_delivery.h"

namespace hybrid_ep {
namespace dispatch {

// 6 or 8 store warps measured no faster (and 8 slower at 2 and 8 ranks).
constexpr int kStoreWarps = 4;
// Several network warps: one warp's puts (a load then a store per lane and vector) reach a few
// GB/s, far below what the network leg needs with several domains.
constexpr int kNetworkWarps = 4;
constexpr int kThreads = 32 * (1 + kStoreWarps + kNetworkWarps);
constexpr uint32_t kStoreBarrier = 1;    // named barrier of the store warps
constexpr uint32_t kNetworkBarrier = 2;  // of the network warps (an eager chunk's crew)
// Each store warp holds one stage while it waits for its next item, so the ring needs two
// stages per store warp to never starve the loader.
constexpr int kMinStages = 2 * kStoreWarps;

// Warp 0 loads, the next kStoreWarps store, the last kNetworkWarps send between domains; in the
// fused permute role they load, store and zero rows (permute_block).
enum class Role { kLoader, kStore, kNetwork };

__device__ __forceinline__ Role role_of(int warp) {
  if (warp == 0) return Role::kLoader;
  return warp <= kStoreWarps ? Role::kStore : Role::kNetwork;
}
__device__ __forceinline__ int store_warp_index(int warp) { return warp - 1; }
__device__ __forceinline__ int network_warp_index(int warp) { return warp - 1 - kStoreWarps; }

__host__ __device__ constexpr int align_up(int v, int a) { return (v + a - 1) / a * a; }

// What one ring stage holds, and where: a row, then its probs and scales where the ring carries
// them (by TMA from 16-byte aligned tensors, or an eager record, whose parts sit exactly so).
struct StageLayout {
  int row_bytes, prob_bytes, scale_bytes;  // side bytes are 0 when the ring never carries them
  int prob_at, scale_at, stride;

  __host__ __device__ static StageLayout make(const DispatchParams& p) {
    StageLayout s{};
    const bool side = p.side_by_tma || p.eager;
    s.row_bytes = p.row_bytes;
    s.prob_bytes = side && p.probs != nullptr ? p.prob_cols * 4 : 0;
    s.scale_bytes = side && p.scales != nullptr ? p.scale_cols * 4 : 0;
    s.prob_at = align_up(s.row_bytes, 16);
    s.scale_at = s.prob_at + align_up(s.prob_bytes, 16);
    s.stride = align_up(s.scale_at + s.scale_bytes, 128);
    return s;
  }
  // Bytes a row brings with its side data (`side`) or without.
  __host__ __device__ int bytes(bool side) const {
    return row_bytes + (side ? prob_bytes + scale_bytes : 0);
  }
};

// Where rows for one local rank land: the regions of its registered buffer, or (this rank's
// own rows, DispatchParams::own) the caller's outputs, or inside one domain wherever that rank
// published (its zero-copy outputs); rows from `capacity` on have no room there.
struct RowTargets {
  uint8_t* rows;
  uint8_t* probs;
  uint8_t* scales;
  int64_t capacity;
};

__device__ __forceinline__ RowTargets row_targets(const DispatchParams& p, int j) {
  constexpr int64_t kAll = INT64_MAX;  // the receive regions hold every row metadata kept
  if (j == p.domain.local_rank && p.own.rows != nullptr) {
    return {p.own.rows, reinterpret_cast<uint8_t*>(p.own.probs),
            reinterpret_cast<uint8_t*>(p.own.scales), kAll};
  }
  uint8_t* peer = p.domain.peer(j);
  if (p.published_targets) {
    using T = ReceiveTargets;
    const volatile uint64_t* w =
        reinterpret_cast<const volatile uint64_t*>(peer + p.receive_targets);
    return {peer + w[T::kDispatchRows], peer + w[T::kDispatchProbs], peer + w[T::kDispatchScales],
            int64_t(w[T::kDispatchCapacity])};
  }
  return {peer + p.dispatch_rows, peer + p.dispatch_probs, peer + p.dispatch_scales, kAll};
}

__host__ __device__ constexpr int run_count(int chunk) { return (chunk + 1) / 2; }

// The block's shared memory, one plan for the carve and the size: the ring, then the rows'
// targets, the routes of two chunks (the loader's, the store warps'), the network warps' runs,
// the chunk arrivals, the eager epoch and an eager put's delivery.
struct SmemParts {
  SmemPlan plan;
  size_t targets = 0, routes = 0, runs = 0, arrivals = 0, epoch = 0, eager_due = 0;  // offsets

  __host__ __device__ static SmemParts make(int stride, int stages, int chunk, int ranks) {
    SmemParts m{SmemPlan(stride, stages)};
    m.targets = m.plan.place<RowTargets>(ranks);
    m.routes = m.plan.place<int32_t>(2 * size_t(chunk) * ranks);
    m.runs = m.plan.place<TokenRun>(size_t(run_count(chunk)) * kNetworkWarps);
    m.arrivals = m.plan.place<int>(4);
    m.epoch = m.plan.place<uint64_t>(1);
    m.eager_due = m.plan.place<EagerDelivery>(1);
    return m;
  }
  __host__ __device__ static SmemParts of(const DispatchParams& p) {
    return make(StageLayout::make(p).stride, p.stages, p.chunk, p.domain.ranks);
  }
};

struct Smem {
  Ring ring;
  // [ranks]: where each local rank's rows land, from the peer table in global memory, whose
  // load sat in a store lane's chain for every destination of every row.
  RowTargets* targets;
  ChunkRoutes loader_routes, store_routes;
  TokenRun* runs;            // the network warps' scratch, run_count(chunk) each
  int* chunk_arrivals;       // [2] fused with permute: store warps done with a chunk, by parity
  int* credit_arrivals;      // [2] several domains: store warps done with a peer's chunk, by parity
  uint64_t* epoch;           // the eager form's epoch of this kernel (EagerEpoch)
  EagerDelivery* eager_due;  // the network warps' current eager put (EagerCrew)
  StageLayout layout;
};

__device__ __forceinline__ Smem carve(uint8_t* base, const DispatchParams& p) {
  Smem s;
  s.layout = StageLayout::make(p);
  const SmemParts m = SmemParts::make(s.layout.stride, p.stages, p.chunk, p.domain.ranks);
  s.ring = Ring::carve(base, m.plan);
  s.targets = reinterpret_cast<RowTargets*>(base + m.targets);
  int32_t* routes = reinterpret_cast<int32_t*>(base + m.routes);
  s.loader_routes = ChunkRoutes{routes, p.domain.ranks};
  s.store_routes = ChunkRoutes{routes + p.chunk * p.domain.ranks, p.domain.ranks};
  s.runs = reinterpret_cast<TokenRun*>(base + m.runs);
  s.chunk_arrivals = reinterpret_cast<int*>(base + m.arrivals);
  s.credit_arrivals = s.chunk_arrivals + 2;
  s.epoch = reinterpret_cast<uint64_t*>(base + m.epoch);
  s.eager_due = reinterpret_cast<EagerDelivery*>(base + m.eager_due);
  return s;
}

}  // namespace dispatch
}  // namespace hybrid_ep

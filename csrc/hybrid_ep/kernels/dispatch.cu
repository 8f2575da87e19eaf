// Dispatch: persistent, one CTA per SM, warp-specialised.
//   network warp : (several domains) sends this rank's chunks to the peer of every other
//                  domain: one put per run of tokens per tensor, one signal per chunk and domain;
//   loader warp  : stages the chunk's routes, then one lane TMA-loads each row that leaves
//                  (with its probs and FP8 scales when they are 16-byte aligned) into a
//                  shared-memory ring guarded by full/empty mbarriers. It forwards this rank's
//                  own chunks first, then the chunks the peers of the other domains sent here,
//                  each once its network flag says it arrived;
//   store warps  : per destination rank, lane 0 issues the row's TMA bulk store and the other
//                  lanes store its probs and scales, straight into that rank's registered
//                  buffer (inside one domain, a rank's rows for itself can go straight into the
//                  caller's output instead: DispatchParams::own);
//   at the end   : one monotonic flag per (forwarder, domain, chunk) in every destination, also
//                  for chunks with nothing for it; then each block waits for the chunks it
//                  receives.
// Chunk c of every domain belongs to dispatch block c % dispatch_blocks on every rank.
// Fused with permute (dispatch_permute.cuh), the grid's blocks also permute: inside one domain
// every block sends its chunks, then permutes; with several domains the blocks past the
// dispatch blocks permute. The store warps then signal each chunk as soon as it is written, and
// the permute role, not the dispatch role, waits for the incoming chunks.
#include <algorithm>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/common/ptx.cuh"
#include "hybrid_ep/kernels/common/chunk_routes.cuh"
#include "hybrid_ep/kernels/common/domains.cuh"
#include "hybrid_ep/kernels/common/eager_epoch.cuh"
#include "hybrid_ep/kernels/common/flags.cuh"
#include "hybrid_ep/kernels/common/launch.h"
#include "hybrid_ep/kernels/common/ring.cuh"
#include "hybrid_ep/kernels/common/ring_pos.cuh"
#include "hybrid_ep/kernels/common/smem_plan.h"
#include "hybrid_ep/kernels/dispatch_block.cuh"
#include "hybrid_ep/kernels/dispatch_eager.cuh"
#include "hybrid_ep/kernels/dispatch_network.cuh"
#include "hybrid_ep/kernels/dispatch_permute.cuh"
#include "hybrid_ep/kernels/dispatch_walk.cuh"
#include "hybrid_ep/kernels/params.h"

namespace hybrid_ep {
namespace {

using namespace dispatch;

// Whether a token goes to a rank of the domain other than `skip` (-1: to any rank).
__device__ __forceinline__ bool any_destination(const int32_t* rows, int ranks, int skip) {
  for (int j = 0; j < ranks; ++j) {
    if (rows[j] >= 0 && j != skip) return true;
  }
  return false;
}

// The local rank that domain `node`'s tokens are not stored to, or -1. Fused with permute, this
// rank's own tokens for itself stay where they are: the permute role reads them from the
// caller's tensors (the rows written and read back through this rank's own buffer were a fifth
// of the fused kernel's HBM traffic at one rank).
__device__ __forceinline__ int skipped_rank(const DispatchParams& p, int node) {
  return p.permute_blocks > 0 && node == p.domain.node_rank ? p.domain.local_rank : -1;
}

// Which of 32 consecutive tokens of a staged chunk (from `base`, `tokens` in all) leave: one
// ballot per 32 tokens, so that the issuing lanes walk only the tokens that leave instead of
// testing every token on one lane (the roles' per-item instruction chains bounded the kernel
// on small rows).
__device__ __forceinline__ uint32_t leaving_tokens(const ChunkRoutes& routes, int base, int tokens,
                                                   int skip, int lane) {
  const int k = base + lane;
  return __ballot_sync(~0u, k < tokens && any_destination(routes.token(k), routes.ranks, skip));
}

// Whether chunk c of domain `node` came in the eager form (a peer's, HYBRID_EP_EAGER).
__device__ __forceinline__ bool is_eager(const DispatchParams& p, int node) {
  return p.eager && node != p.domain.node_rank;
}

// Loader warp: the ring producer (lane 0 issues, the warp stages the routes and finds the
// tokens that leave). Returns the ring items it produced.
__device__ uint32_t load_rows(const DispatchParams& p, const Smem& s, int lane) {
  uint32_t item = 0;
  RingPos at{0, 0};  // lane 0's
  const DispatchWalk walk = DispatchWalk::of(p);
  for (int k = 0; k < walk.items; ++k) {
    const WalkItem w = walk.at(p, k);
    const int node = w.node, c = w.c;
    const RowSource src = row_source(p, node, c);
    const int skip = skipped_rank(p, node);
    const ChunkRange r = chunk_range(p, node, c);
    __syncwarp();  // lane 0 is done with the previous chunk's routes
    s.loader_routes.load(src.routes, r.first, r.last, lane, 32);
    __syncwarp();
    bool arrived = lane != 0 || chunk_arrived(p, node, c);
    const int tokens = r.last - r.first;
    const bool eager = is_eager(p, node);
    EagerReader reader{};
    if (eager) {  // its records: the chunk's tokens that come here, in order
      int records = 0;
      for (int base = 0; base < tokens; base += 32) {
        records += __popc(leaving_tokens(s.loader_routes, base, tokens, skip, lane));
      }
      reader = EagerReader::of(src.rows, records, p.row_bytes, s.layout.prob_bytes,
                               s.layout.scale_bytes, eager_signal_value(*s.epoch, uint32_t(c)));
    }
    int64_t record = 0;
    for (int base = 0; base < tokens; base += 32) {
      const uint32_t leaving = leaving_tokens(s.loader_routes, base, tokens, skip, lane);
      item += __popc(leaving);
      if (eager) {  // the whole warp waits for the records' tiles, lane 0 loads them
        for (uint32_t m = leaving; m != 0; m &= m - 1, ++record) {
          int stage = 0;
          if (lane == 0) {
            stage = at.stage;
            s.ring.acquire(at);
            at.advance(1, s.ring.stages);
          }
          if (arrived) arrived = reader.wait_record(record, p.domain, node, c, lane);
          if (lane != 0) continue;
          if (!arrived) {
            s.ring.skip(stage);
            continue;
          }
          s.ring.expect(stage, uint32_t(reader.payload.record));
          reader.load(s.ring, stage, record);
        }
        continue;
      }
      if (lane != 0) continue;
      for (uint32_t m = leaving; m != 0; m &= m - 1) {
        const int t = r.first + base + __ffs(m) - 1;
        const int stage = at.stage;
        s.ring.acquire(at);
        at.advance(1, s.ring.stages);
        if (!arrived) {
          s.ring.skip(stage);
          continue;
        }
        s.ring.expect(stage, s.layout.bytes(p.side_by_tma));
        s.ring.load(stage, 0, src.rows + int64_t(t) * p.row_bytes, p.row_bytes);
        if (p.side_by_tma && s.layout.prob_bytes) {
          s.ring.load(stage, s.layout.prob_at, src.probs + int64_t(t) * src.prob_stride,
                      s.layout.prob_bytes);
        }
        if (p.side_by_tma && s.layout.scale_bytes) {
          s.ring.load(stage, s.layout.scale_at, src.scales + int64_t(t) * p.scale_cols,
                      s.layout.scale_bytes);
        }
      }
    }
  }
  return item;
}

// Probs and scales that are not 16-byte aligned: the warp's lanes copy them with plain stores.
__device__ __forceinline__ void store_side_data_by_lanes(const DispatchParams& p,
                                                         const RowSource& from, int t,
                                                         const RowTargets& to, int row, int lane) {
  if (p.probs != nullptr) {
    const float* src = from.probs + int64_t(t) * from.prob_stride;
    float* dst = reinterpret_cast<float*>(to.probs) + int64_t(row) * p.prob_cols;
    for (int k = lane; k < p.prob_cols; k += 32) dst[k] = src[k];
  }
  if (p.scales != nullptr) {
    const float* src = from.scales + int64_t(t) * p.scale_cols;
    float* dst = reinterpret_cast<float*>(to.scales) + int64_t(row) * p.scale_cols;
    for (int k = lane; k < p.scale_cols; k += 32) dst[k] = src[k];
  }
}

// Probs and scales staged in the ring: lanes 1.. copy them out of the stage with 16-byte
// stores while lane 0 issues the row's bulk store. Two more bulk stores per row and destination
// had cost the TMA unit more than the lanes cost (1 rank x 8 SMs: BF16 164.2 -> 159.8 us).
__device__ __forceinline__ void store_staged_side_data(const Smem& s, const uint8_t* stage,
                                                       const RowTargets& to, int row, int lane) {
  if (((s.layout.prob_bytes | s.layout.scale_bytes) & 15) != 0) {
    // Only an eager record brings side data whose rows are not 16-byte multiples: by floats.
    const int prob_floats = s.layout.prob_bytes / 4;
    const int floats = prob_floats + s.layout.scale_bytes / 4;
    for (int v = lane - 1; v >= 0 && v < floats; v += 31) {
      const bool prob = v < prob_floats;
      const int at = prob ? v : v - prob_floats;
      const float value =
          reinterpret_cast<const float*>(stage + (prob ? s.layout.prob_at : s.layout.scale_at))[at];
      float* dst = prob ? reinterpret_cast<float*>(to.probs) + int64_t(row) * prob_floats + at
                        : reinterpret_cast<float*>(to.scales) +
                              int64_t(row) * (s.layout.scale_bytes / 4) + at;
      *dst = value;
    }
    return;
  }
  const int prob_vectors = s.layout.prob_bytes / 16;
  const int vectors = prob_vectors + s.layout.scale_bytes / 16;
  for (int v = lane - 1; v >= 0 && v < vectors; v += 31) {
    const bool prob = v < prob_vectors;
    const int at = prob ? v * 16 : (v - prob_vectors) * 16;
    const uint4 value =
        *reinterpret_cast<const uint4*>(stage + (prob ? s.layout.prob_at : s.layout.scale_at) + at);
    uint8_t* dst = prob ? to.probs + int64_t(row) * s.layout.prob_bytes + at
                        : to.scales + int64_t(row) * s.layout.scale_bytes + at;
    *reinterpret_cast<uint4*>(dst) = value;
  }
}

// Waits until this store warp's bulk stores are performed and visible to other processes, and
// frees the stage they read.
__device__ __forceinline__ void drain_stores(const Smem& s, int lane, int& pending_stage) {
  if (lane == 0) {
    ptx::bulk_wait<0>();
    if (pending_stage >= 0) s.ring.release(pending_stage);
    ptx::fence_proxy_async_global();
  }
  pending_stage = -1;
  __threadfence_system();
}

// Flag of chunk c of domain `node`, forwarded by this rank, in local rank j's buffer.
__device__ __forceinline__ uint64_t* chunk_flag(const DispatchParams& p, int j, int node, int c) {
  const DomainView& d = p.domain;
  return reinterpret_cast<uint64_t*>(d.peer(j) + p.dispatch_flags.slot(d.local_rank, node, c));
}

// Lane 0 of a store warp whose bulk stores of the block's chunk number `ordinal` (chunk c of
// domain `node`) are complete: counts the warp in; the last store warp in signals the chunk to
// every rank of the domain. Chunks k and k + 1 are the only ones counting at any time (every
// warp counts in for k before it passes the routes barrier of chunk k + 2), hence two counters.
__device__ void count_in(const DispatchParams& p, int* arrivals, int ordinal, int node, int c) {
  ptx::fence_proxy_async_global();
  __threadfence_system();
  if (atomicAdd(&arrivals[ordinal & 1], 1) % kStoreWarps != kStoreWarps - 1) return;
  for (int j = 0; j < p.domain.ranks; ++j) signal_flag(chunk_flag(p, j, node, c));
}

// A store warp done with chunk c of another domain (the block's chunk number `ordinal`): every
// item of it it stored has left its ring slot (its TMA load landed; side data read by lanes
// was read). The last store warp in credits the chunk back to that domain's peer, whose next
// chunk for the slot may then come (on the control transport: credits are not data). As in
// count_in, only chunks k and k + 1 count at any time.
__device__ void credit_chunk(const DispatchParams& p, int* arrivals, int ordinal, int node, int c,
                             int lane) {
  bool last = false;
  if (lane == 0) {
    __threadfence_block();
    last = atomicAdd(&arrivals[ordinal & 1], 1) % kStoreWarps == kStoreWarps - 1;
  }
  if (!__shfl_sync(~0u, last, 0) || p.withhold_credits) return;
  const DomainView& d = p.domain;
  TransportDevice::signal(p.control, blockIdx.x % p.channels, node,
                          p.dispatch_credits.slot(d.node_rank, c), 1, lane);
}

// A chunk this store warp has not counted in for yet (fused with permute).
struct UncountedChunk {
  int ordinal = -1, node = 0, c = 0;
  __device__ bool some() const { return ordinal >= 0; }
};

// Store warp `w`: consumes ring items w, w + kStoreWarps, ...; releases a stage once the bulk
// stores that read it are done reading. The store pipe is drained once, after the block's
// last chunk, and then every chunk of the block is signalled to every rank of the domain
// (including ranks that got nothing from it): per-chunk drains left the pipe idle. Fused with
// permute, each chunk is signalled as soon as it is written, so that permuting starts early,
// still without draining: a warp's first commit of the next chunk waits only for the groups
// before it (all of the previous chunk's) and counts the warp in for that chunk.
// Returns the ring items of the block (consumed by all store warps).
__device__ uint32_t store_rows(const DispatchParams& p, const Smem& s, int w, int lane) {
  const DomainView& d = p.domain;
  const int thread = w * 32 + lane;
  const bool signal_each_chunk = p.permute_blocks > 0;
  uint32_t item = 0;       // ring items of the block so far (all store warps')
  RingPos at{w, 0};        // of this warp's next item: w, w + kStoreWarps, ...
  int pending_stage = -1;  // stage whose stores were committed but maybe not read yet
  int ordinal = 0;         // of the block's chunk
  UncountedChunk uncounted;
  const DispatchWalk walk = DispatchWalk::of(p);
  // Item k of the walk's routes, or nothing past the last one.
  const auto fetch = [&](HeldRoutes& held, int k) {
    if (k >= walk.items) return held.clear();
    const WalkItem w = walk.at(p, k);
    const ChunkRange r = chunk_range(p, w.node, w.c);
    held.fetch(row_source(p, w.node, w.c).routes, r.first, r.last, d.ranks, thread,
               32 * kStoreWarps);
  };
  HeldRoutes next;
  fetch(next, 0);
  for (int k = 0; k < walk.items; ++k) {
    const WalkItem wi = walk.at(p, k);
    const int node = wi.node, c = wi.c;
    const RowSource src = row_source(p, node, c);
    const int skip = skipped_rank(p, node);
    const ChunkRange r = chunk_range(p, node, c);
    ptx::named_barrier(kStoreBarrier, 32 * kStoreWarps);  // done with the previous routes
    next.put(s.store_routes, thread, 32 * kStoreWarps);
    ptx::named_barrier(kStoreBarrier, 32 * kStoreWarps);
    fetch(next, k + 1);
    bool stored = false;  // by this warp, of this chunk
    const int tokens = r.last - r.first;
    const bool staged_side = p.side_by_tma || is_eager(p, node);
    for (int base = 0; base < tokens; base += 32) {
      const uint32_t leaving = leaving_tokens(s.store_routes, base, tokens, skip, lane);
      const int n = __popc(leaving);
      // This warp's items of the group: its k-th leaving tokens with item + k = w (mod warps).
      for (int k = to_own_item(item, w, kStoreWarps); k < n; k += kStoreWarps) {
        const int bit = __fns(leaving, 0, k + 1);
        const int t = r.first + base + bit;
        const int32_t* rows = s.store_routes.token(base + bit);
        const int stage = at.stage;
        s.ring.wait(at);
        at.advance(kStoreWarps, s.ring.stages);
        for (int j = 0; j < d.ranks; ++j) {
          const RowTargets& to = s.targets[j];
          if (rows[j] < 0 || j == skip || rows[j] >= to.capacity) continue;
          if (lane == 0) {
            ptx::bulk_store(to.rows + int64_t(rows[j]) * p.row_bytes, s.ring.stage(stage),
                            p.row_bytes);
          }
          if (staged_side) {
            store_staged_side_data(s, s.ring.stage(stage), to, rows[j], lane);
          } else {
            store_side_data_by_lanes(p, src, t, to, rows[j], lane);
          }
        }
        __syncwarp();  // the lanes are done reading the stage before lane 0 releases it
        const bool count_previous = !stored && uncounted.some();
        if (lane == 0) {
          ptx::bulk_commit();
          if (count_previous) {  // all groups but this one are complete: the previous chunk's
            ptx::bulk_wait<1>();
            count_in(p, s.chunk_arrivals, uncounted.ordinal, uncounted.node, uncounted.c);
          } else {
            ptx::bulk_wait_read<1>();  // the previous item's group no longer reads its stage
          }
          if (pending_stage >= 0) s.ring.release(pending_stage);
        }
        if (count_previous) uncounted = {};
        stored = true;
        pending_stage = stage;
      }
      item += n;
    }
    if (signal_each_chunk) {
      if (stored) {
        uncounted = {ordinal, node, c};
      } else if (lane == 0) {  // nothing of this chunk in flight: count in for both now
        ptx::bulk_wait<0>();
        if (uncounted.some()) {
          count_in(p, s.chunk_arrivals, uncounted.ordinal, uncounted.node, uncounted.c);
        }
        count_in(p, s.chunk_arrivals, ordinal, node, c);
      }
      if (!stored) uncounted = {};
    }
    if (node != d.node_rank && credit_flows(p.ring_chunks, p.max_chunks, c)) {
      credit_chunk(p, s.credit_arrivals, ordinal, node, c, lane);
    }
    ++ordinal;
  }
  // Make every write of the store warps visible, then signal this block's chunks.
  drain_stores(s, lane, pending_stage);
  if (signal_each_chunk) {
    if (lane == 0 && uncounted.some()) {
      count_in(p, s.chunk_arrivals, uncounted.ordinal, uncounted.node, uncounted.c);
    }
    return item;
  }
  ptx::named_barrier(kStoreBarrier, 32 * kStoreWarps);
  for (int k = thread; k < walk.items * d.ranks; k += 32 * kStoreWarps) {
    const WalkItem w = walk.at(p, k / d.ranks);
    signal_flag(chunk_flag(p, k % d.ranks, w.node, w.c));
  }
  return item;
}

// All threads: wait for every chunk this block receives (chunk c of every local rank).
__device__ void wait_incoming(const DispatchParams& p) {
  const DomainView& d = p.domain;
  const int my_chunks =
      (p.max_chunks - int(blockIdx.x) + p.dispatch_blocks - 1) / p.dispatch_blocks;
  for (int k = threadIdx.x; k < my_chunks * d.nodes * d.ranks; k += blockDim.x) {
    const int source = k % d.ranks;
    const int node = (k / d.ranks) % d.nodes;
    const int c = blockIdx.x + (k / (d.ranks * d.nodes)) * p.dispatch_blocks;
    const size_t slot = p.dispatch_flags.slot(source, node, c);
    if (!wait_flag(reinterpret_cast<const uint64_t*>(d.self() + slot), d.expected_for(slot), d,
                   WaitSite::kDispatchChunk, source, node * p.max_chunks + c)) {
      return;
    }
  }
}

// The permute role of block `block` of the fused grid: warp 0 loads, the store warps store, the
// network warps (idle here) write the zero rows. The ring goes on from item `ring_items`.
__device__ void permute_block(const DispatchParams& p, const Smem& s, int block, int warp, int lane,
                              uint32_t ring_items) {
  switch (role_of(warp)) {
    case Role::kLoader:
      permute_load_rows(p, s.ring, block, lane, ring_items);
      break;
    case Role::kStore:
      permute_store_rows(p, s.ring, block, store_warp_index(warp), kStoreWarps, lane, ring_items);
      break;
    case Role::kNetwork:
      permute_zero_rows(p, block, network_warp_index(warp), kNetworkWarps, lane);
      break;
  }
}

__global__ void __launch_bounds__(kThreads, 1) dispatch_kernel(DispatchParams p) {
  // After a failed wait the buffer is unusable: do nothing rather than touch peers.
  if (p.domain.aborted()) return;
  extern __shared__ __align__(128) uint8_t smem[];
  const Smem s = carve(smem, p);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int i = 0; i < 4; ++i) s.chunk_arrivals[i] = 0;  // and credit_arrivals
    s.ring.init();
    *s.epoch = p.eager
                   ? EagerEpoch{reinterpret_cast<uint64_t*>(p.domain.self() + p.eager_epoch)}.take(
                         int(gridDim.x))
                   : 0;
  }
  // One warp reads where each receiver's rows land (published before the launch: the publish
  // kernel waited for every receiver's release), before any warp takes its role.
  if (warp == 1) {
    for (int j = lane; j < p.domain.ranks; j += 32) s.targets[j] = row_targets(p, j);
  }
  __syncthreads();
  // A block may dispatch, then permute (fused inside one domain, every block does both).
  uint32_t ring_items = 0;
  if (int(blockIdx.x) < p.dispatch_blocks) {
    switch (role_of(warp)) {
      case Role::kLoader:
        ring_items = load_rows(p, s, lane);
        break;
      case Role::kStore:
        ring_items = store_rows(p, s, store_warp_index(warp), lane);
        break;
      case Role::kNetwork:
        if (p.domain.nodes > 1) {
          const EagerCrew crew{network_warp_index(warp), kNetworkWarps, kNetworkBarrier,
                               s.eager_due};
          send_own_chunks(p, *s.epoch, s.runs + crew.warp * run_count(p.chunk), crew, lane);
        }
        break;
    }
  }
  if (p.permute_blocks > 0) {
    const int block = int(blockIdx.x) - p.first_permute_block;
    if (block >= 0) permute_block(p, s, block, warp, lane, ring_items);
    return;
  }
  __syncthreads();
  if (p.permute_blocks == 0) wait_incoming(p);
}

// The fused permute's consumer counters: the permute blocks waited for target = counter + 1
// of every incoming chunk flag without moving it (several blocks wait for one chunk).
__global__ void advance_dispatch_expected(DispatchParams p) {
  const DomainView& d = p.domain;
  const int flags = int(p.dispatch_flags.count());
  for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < flags; k += gridDim.x * blockDim.x) {
    ++*d.expected_for(p.dispatch_flags.nth(k));
  }
}

bool aligned16(const void* ptr, int64_t stride_bytes) {
  return (reinterpret_cast<uintptr_t>(ptr) % 16) == 0 && stride_bytes % 16 == 0;
}

}  // namespace

int dispatch_min_stages() { return kMinStages; }

size_t dispatch_reserved_smem(int chunk, int ranks) {
  return SmemParts::make(0, 0, chunk, ranks).plan.reserved();
}

size_t dispatch_stage_bytes(const DispatchParams& p) {
  return SmemPlan::stage_bytes(StageLayout::make(p).stride);
}

bool dispatch_side_data_by_tma(const DispatchParams& p) {
  const bool probs_ok =
      p.probs == nullptr || (aligned16(p.probs, int64_t(p.experts_total) * 4) &&
                             (p.prob_col_offset * 4) % 16 == 0 && (p.prob_cols * 4) % 16 == 0);
  const bool scales_ok = p.scales == nullptr || (aligned16(p.scales, int64_t(p.scale_cols) * 4) &&
                                                 (p.scale_cols * 4) % 16 == 0);
  return probs_ok && scales_ok;
}

void launch_dispatch(const DispatchParams& p, cudaStream_t stream) {
  const size_t smem = SmemParts::of(p).plan.bytes();
  allow_dynamic_smem(reinterpret_cast<const void*>(dispatch_kernel), smem);
  // Without permute blocks this is dispatch_blocks.
  const int grid = std::max(p.dispatch_blocks, p.first_permute_block + p.permute_blocks);
  dispatch_kernel<<<grid, kThreads, smem, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
  if (p.permute_blocks > 0) {
    advance_dispatch_expected<<<1, 256, 0, stream>>>(p);
    HYBRID_EP_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace hybrid_ep

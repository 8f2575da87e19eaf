// Domain barrier: every local rank bumps its slot in every peer, then waits for all slots.
// Runs between operations so that no rank overwrites a peer's buffer that is still being read.
// Each signal carries the call's stamp (hybrid_ep/call_stamp.py), compared after the wait. The
// routing all-gather signals the same flags (allgather.cu), so that ranks of which some start
// a call with the barrier and some with the all-gather meet and find the mismatch.
// With several domains a second warp does the same with the peer of every other domain
// through the transport (their puts land in this rank's receive tiles).
// Inside one domain a dispatch starts with receive_publish_kernel instead (named so that no
// profile filter for "dispatch_kernel" counts it): each rank writes where that dispatch's rows
// land (its registered regions, or the caller's zero-copy outputs) and bumps its release of its
// receive region, stream-ordered after its reads of the previous dispatch's rows, then waits
// for every peer's release of this call. A combine there starts with combine_start_kernel (the
// wait for the peers' pulls of the previous input, where this input is, the barrier) and ends
// with combine_end_kernel (the ranks count their pulls from each other).
#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/kernels/common/flags.cuh"
#include "hybrid_ep/kernels/params.h"
#include "hybrid_ep/transport/transport_device.cuh"

namespace hybrid_ep {
namespace {

// Thread `peer`: this rank's stamp and signal to local rank `peer`, then the wait for its
// signal and the check of the stamp it carried.
__device__ void local_barrier(const BarrierParams& p, int peer) {
  const DomainView& d = p.domain;
  if (peer >= d.ranks) return;
  const size_t mine = p.barrier_flags.slot(peer);
  // This barrier's count with `peer`, the same on both sides: it picks the stamp slot.
  const uint64_t count = *d.expected_for(mine) + 1;
  uint8_t* to = d.peer(peer);
  *reinterpret_cast<uint64_t*>(to + stamp_slot(p.barrier_stamps, d.ranks, count, d.local_rank)) =
      d.stamp;
  signal_flag(reinterpret_cast<uint64_t*>(to + p.barrier_flags.slot(d.local_rank)));
  if (!wait_flag(reinterpret_cast<const uint64_t*>(d.self() + mine), d.expected_for(mine), d,
                 WaitSite::kBarrier, peer, 0)) {
    return;
  }
  const uint64_t theirs = *reinterpret_cast<const volatile uint64_t*>(
      d.self() + stamp_slot(p.barrier_stamps, d.ranks, count, peer));
  stamps_agree(d, theirs, WaitSite::kBarrier, peer);
}

// One warp, after the domain's part: this rank's stamp (with whether its domain agreed) and a
// signal to the peer of every other domain, then lane n waits for domain n's and checks the
// stamp it carried.
__device__ void network_barrier(const BarrierParams& p, int lane) {
  const DomainView& d = p.domain;
  uint8_t* self = d.self();
  for (int n = 0; n < d.nodes; ++n) {
    if (n == d.node_rank) continue;
    const size_t slot = stamp_slot(p.net_barrier_stamps, d.nodes,
                                   *d.expected_for(p.net_barrier_flags.slot(n)) + 1, d.node_rank);
    // The put's source is this rank's own slot (registered, as RDMA puts need).
    if (lane == 0) *reinterpret_cast<uint64_t*>(self + slot) = stamp_for_network(d);
    __threadfence_system();
    __syncwarp();
    TransportDevice::put(p.transport, 0, n, slot, self + slot, sizeof(uint64_t), lane);
    TransportDevice::signal(p.transport, 0, n, p.net_barrier_flags.slot(d.node_rank), 1, lane);
  }
  TransportDevice::flush(p.transport, 0, lane);
  for (int n = lane; n < d.nodes; n += 32) {
    if (n == d.node_rank) continue;
    const size_t mine = p.net_barrier_flags.slot(n);
    const uint64_t count = *d.expected_for(mine) + 1;
    if (!wait_flag(reinterpret_cast<const uint64_t*>(self + mine), d.expected_for(mine), d,
                   WaitSite::kNetworkBarrier, n, 0)) {
      continue;
    }
    const uint64_t theirs = *reinterpret_cast<const volatile uint64_t*>(
        self + stamp_slot(p.net_barrier_stamps, d.nodes, count, n));
    stamps_agree(d, theirs, WaitSite::kNetworkBarrier, n);
  }
}

// The whole block, after the caller's check of the abort flag.
__device__ void barrier_body(const BarrierParams& p) {
  const int local_threads = (p.domain.ranks + 31) / 32 * 32;
  if (int(threadIdx.x) < local_threads) local_barrier(p, threadIdx.x);
  // The network part follows the domain's, so that its stamps say whether the domain agreed:
  // then every rank of every domain learns of a mismatch anywhere.
  __syncthreads();
  if (int(threadIdx.x) >= local_threads) network_barrier(p, threadIdx.x % 32);
  __syncthreads();
  if (threadIdx.x == 0) p.domain.settle();
}

__global__ void domain_barrier_kernel(BarrierParams p) {
  if (p.domain.aborted()) return;
  barrier_body(p);
}

// Thread j: one more combine pulled from local rank j (this rank's own slot: its count).
__device__ void signal_pulled(const DomainView& d, size_t combine_pulled, int j) {
  if (j >= d.ranks || d.aborted()) return;
  uint8_t* at = (j == d.local_rank ? d.self() : d.peer(j)) + combine_pulled;
  signal_flag(reinterpret_cast<uint64_t*>(at) + d.local_rank);
}

// Thread j: local rank j has pulled from this rank's inputs as often as this rank combined.
__device__ void wait_pulled(const DomainView& d, size_t combine_pulled, int j) {
  if (j >= d.ranks || j == d.local_rank || d.aborted()) return;
  const uint64_t* slots = reinterpret_cast<const uint64_t*>(d.self() + combine_pulled);
  const uint64_t combined = *reinterpret_cast<const volatile uint64_t*>(slots + d.local_rank);
  wait_until(slots + j, combined, d, WaitSite::kCombinePulled, j, 0);
}

__global__ void wait_pulled_kernel(DomainView d, size_t combine_pulled) {
  wait_pulled(d, combine_pulled, threadIdx.x);
}

// Before a combine kernel inside one domain of several ranks, one launch instead of three (each
// launch cost ~8 us of host time with 8 ranks sharing the GPU): the wait for the peers' pulls of
// the previous input (unless done already), where this call's input is (`values` at `words`),
// then the domain barrier, after which the peers read those words.
__global__ void combine_start_kernel(BarrierParams p, size_t combine_pulled, bool wait,
                                     uint64_t* words, ReceiveTargetWords values) {
  if (wait) wait_pulled(p.domain, combine_pulled, threadIdx.x);
  // Block-uniform: a timed-out wait leaves out the rest, as a separate barrier launch would.
  if (__syncthreads_or(p.domain.aborted())) return;
  if (threadIdx.x == 0) {
    for (int k = 0; k < values.count; ++k) words[k] = values.at[k];
  }
  __syncthreads();  // the barrier's signals (fenced) follow the words
  barrier_body(p);
}

// After a combine kernel: the pulls counted in every peer, then (`wait`) until every peer has
// counted its pulls of this rank's input.
__global__ void combine_end_kernel(DomainView d, size_t combine_pulled, bool wait) {
  signal_pulled(d, combine_pulled, threadIdx.x);
  if (!wait) return;
  __syncthreads();  // this rank's own count, in its slot, is the one to wait for
  wait_pulled(d, combine_pulled, threadIdx.x);
}

// Inside one domain, before a dispatch kernel: thread 0 writes where this call's rows land and
// releases this rank's receive region; thread j then waits until local rank j has done the
// same for this call. Waiting here, in one block, rather than in every dispatch block: on a
// GPU that the domain's ranks share, spinning dispatch blocks of the early ranks filled the
// SMs that the late ranks' publish needed (8 ranks x 32 fused blocks: every call timed out).
__global__ void receive_publish_kernel(DomainView d, size_t targets, ReceiveTargetWords values,
                                       size_t releases) {
  if (d.aborted()) return;
  __shared__ uint64_t released;
  uint64_t* own = reinterpret_cast<uint64_t*>(d.self() + releases);
  if (threadIdx.x == 0) {
    uint64_t* words = reinterpret_cast<uint64_t*>(d.self() + targets);
    for (int k = 0; k < values.count; ++k) words[k] = values.at[k];
    signal_flag(own);  // fenced: the words are seen first
    released = ptx::load_acquire_sys(own);
  }
  __syncthreads();
  const int j = threadIdx.x;
  if (j >= d.ranks || j == d.local_rank) return;
  wait_until(reinterpret_cast<const uint64_t*>(d.peer(j) + releases), released, d,
             WaitSite::kReceiveRelease, j, 0);
}

}  // namespace

void launch_publish_dispatch(const DomainView& d, size_t targets, const ReceiveTargetWords& values,
                             size_t releases, cudaStream_t stream) {
  receive_publish_kernel<<<1, (d.ranks + 31) / 32 * 32, 0, stream>>>(d, targets, values, releases);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

void launch_wait_pulled(const DomainView& d, size_t combine_pulled, cudaStream_t stream) {
  if (d.ranks == 1) return;  // alone, the stream orders every reuse
  wait_pulled_kernel<<<1, (d.ranks + 31) / 32 * 32, 0, stream>>>(d, combine_pulled);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

void launch_combine_start(const BarrierParams& p, size_t combine_pulled, bool wait, uint64_t* words,
                          const ReceiveTargetWords& values, cudaStream_t stream) {
  combine_start_kernel<<<1, (p.domain.ranks + 31) / 32 * 32, 0, stream>>>(p, combine_pulled, wait,
                                                                          words, values);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

void launch_combine_end(const DomainView& d, size_t combine_pulled, bool wait,
                        cudaStream_t stream) {
  if (d.ranks == 1) return;
  combine_end_kernel<<<1, (d.ranks + 31) / 32 * 32, 0, stream>>>(d, combine_pulled, wait);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

void launch_domain_barrier(const BarrierParams& p, cudaStream_t stream) {
  // Alone, a rank's operations are already ordered by its stream: a launch would cost a few
  // microseconds of every call for nothing.
  if (p.domain.ranks == 1 && p.domain.nodes == 1) return;
  const int threads = (p.domain.ranks + 31) / 32 * 32 + (p.domain.nodes > 1 ? 32 : 0);
  domain_barrier_kernel<<<1, threads, 0, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hybrid_ep

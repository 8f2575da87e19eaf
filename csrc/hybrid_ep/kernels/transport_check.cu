// Transport self-test between NVLink domains (a diagnostic, and the transport's GPU test):
// warps put a pattern into the peer of every other domain through TransportDevice and signal
// it, then wait for the peers' signals and count the bytes that differ from their pattern.
#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/common/ptx.cuh"
#include "hybrid_ep/kernels/common/flags.cuh"
#include "hybrid_ep/kernels/params.h"
#include "hybrid_ep/transport/transport_device.cuh"

namespace hybrid_ep {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint8_t pattern(int node, size_t i) {
  return uint8_t(node * 131 + i * 7 + (i >> 8));
}

__global__ void __launch_bounds__(kThreads) transport_check_kernel(TransportCheckParams p) {
  if (p.domain.aborted()) return;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = kThreads / 32;
  const TransportContext& t = p.transport;
  uint8_t* self = p.domain.self();
  uint8_t* source = self + p.scratch;
  for (size_t i = threadIdx.x; i < p.bytes; i += kThreads) source[i] = pattern(t.node_rank, i);
  __syncthreads();
  const size_t my_slot = p.scratch + size_t(1 + t.node_rank) * p.bytes;
  for (int n = warp; n < t.nodes; n += warps) {
    if (n == t.node_rank) continue;
    if (p.times != nullptr && lane == 0) p.times[n] = ptx::global_timer_ns();
    TransportDevice::put(t, p.channel, n, my_slot, source, p.bytes, lane);
    const size_t flag = p.network_flags.slot(t.node_rank, 0);
    TransportDevice::signal(t, p.channel, n, flag, 1, lane);
    TransportDevice::flush(t, p.channel, lane);
  }
  for (int n = warp; n < t.nodes; n += warps) {
    if (n == t.node_rank) continue;
    const size_t flag = p.network_flags.slot(n, 0);
    int ok = 1;
    if (lane == 0) {
      ok = wait_flag(reinterpret_cast<const uint64_t*>(self + flag), p.domain.expected_for(flag),
                     p.domain, WaitSite::kNetworkFlag, n, 0);
      if (p.times != nullptr) p.times[t.nodes + n] = ptx::global_timer_ns();
    }
    ok = __shfl_sync(0xffffffffu, ok, 0);
    unsigned long long bad = 0;
    if (ok) {
      const uint8_t* got = self + p.scratch + size_t(1 + n) * p.bytes;
      for (size_t i = lane; i < p.bytes; i += 32) bad += got[i] != pattern(n, i);
    } else if (lane == 0) {
      bad = p.bytes;
    }
    for (int d = 16; d > 0; d /= 2) bad += __shfl_xor_sync(0xffffffffu, bad, d);
    if (lane == 0) atomicAdd(p.mismatches, bad);
  }
}

}  // namespace

void launch_transport_check(const TransportCheckParams& p, cudaStream_t stream) {
  transport_check_kernel<<<1, kThreads, 0, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hybrid_ep

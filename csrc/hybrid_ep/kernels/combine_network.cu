// Combine across domains, after the partial-mode combine kernel left the fp32 sums of this
// domain's copies of every forwarded token in the partials region. Block b owns chunks
// c = b, b + blocks, ... of the token index space:
//   send   : per (chunk, other domain n), a warp puts the partials of the tokens of n's peer
//            that came to this domain (runs of rdma_to_attn_map[:, n]) into that peer's
//            net_partials tile, then signals the chunk -- also when no token of it came here;
//   reduce : for each chunk of this rank's own tokens, once every other domain's flag is in,
//            the BF16 output is the fp32 sum of the domains' partials in ascending domain order
//            (a domain the token did not go to adds nothing), and combined_probs takes each
//            domain's E*R columns from that domain's partial.
// Sends never wait, so every block sends everything first and no block waits on another.
#include "hybrid_ep/kernels/common/bf16.cuh"
#include "hybrid_ep/kernels/common/domains.cuh"
#include "hybrid_ep/kernels/common/flags.cuh"
#include "hybrid_ep/kernels/common/launch.h"
#include "hybrid_ep/kernels/network_send.cuh"
#include "hybrid_ep/kernels/params.h"
#include "hybrid_ep/runtime/cuda_check.h"

namespace hybrid_ep {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ int runs_per_warp(int chunk) { return (chunk + 1) / 2; }

// Warps share out this block's (chunk, other domain) pairs.
__device__ void send_partials(const CombineNetworkParams& p, TokenRun* runs, int warp, int lane) {
  const DomainView& d = p.domain;
  const int T = p.max_tokens;
  const int others = d.nodes - 1;
  const int my_chunks = (p.max_chunks - int(blockIdx.x) + gridDim.x - 1) / gridDim.x;
  const int channel = blockIdx.x % p.channels;
  const uint8_t* self = d.self();
  const size_t row_bytes = size_t(p.hidden) * sizeof(float);
  const size_t prob_bytes = size_t(p.prob_cols) * sizeof(float);
  const size_t tile = size_t(d.node_rank) * T;  // where this domain's partials land at a peer
  for (int w = warp; w < my_chunks * others; w += kWarps) {
    const int c = blockIdx.x + (w / others) * gridDim.x;
    const int node = other_domain(w % others, d.node_rank);
    const int first = min(c * p.chunk, T), last = min(first + p.chunk, T);
    const bool* came = p.rdma_to_attn_map + node;
    const auto selected = [&](int t) { return came[int64_t(t) * d.nodes]; };
    const size_t from = size_t(node) * T;  // the peer's tokens in this rank's partials
    const NetTensor tensors[kMaxNetTensors] = {
        {self + p.partials + from * row_bytes, p.net_partials + tile * row_bytes, int(row_bytes)},
        {self + p.partial_probs + from * prob_bytes, p.net_partial_probs + tile * prob_bytes,
         p.with_probs ? int(prob_bytes) : 0},
        {nullptr, 0, 0}};
    const size_t flag =
        p.combine_flags + sizeof(uint64_t) * (size_t(d.node_rank) * p.max_chunks + c);
    send_chunk(p.transport, channel, node, selected, first, last, tensors, flag,
               runs + warp * runs_per_warp(p.chunk), lane);
  }
  TransportDevice::flush(p.transport, channel, lane);  // the partials are rewritten next call
}

// Whether token t has a partial from domain n: whether it went there (this domain's column of
// rdma_to_attn_map says whether it stayed here too).
__device__ __forceinline__ bool partial_present(const CombineNetworkParams& p, int n, int t) {
  const int node_rank = p.domain.node_rank;
  if (n == node_rank) return p.rdma_to_attn_map[int64_t(t) * p.domain.nodes + node_rank];
  const int k = other_domain_index(n, node_rank);
  return p.attn_to_rdma_map[int64_t(t) * (p.domain.nodes - 1) + k];
}

__device__ __forceinline__ const float* partial_row(const CombineNetworkParams& p, int n, int t,
                                                    size_t region, size_t own_region, int width) {
  const uint8_t* self = p.domain.self();
  const size_t at = (size_t(n) * p.max_tokens + t) * width;
  return reinterpret_cast<const float*>(self + (n == p.domain.node_rank ? own_region : region)) +
         at;
}

// The block's threads share out (token, 8-column vector) items of the chunk, kItems each per
// round with all their loads issued before the adds: one token at a time (a block per row)
// left the loads of a domain's partial waiting on the previous domain's, and the step took
// several ms per call.
constexpr int kItems = 4;

__device__ void reduce_chunk(const CombineNetworkParams& p, int first, int last) {
  const int nodes = p.domain.nodes;
  const int vectors = p.hidden / 8;
  const int total = (last - first) * vectors;
  for (int base = threadIdx.x; base < total; base += kItems * blockDim.x) {
    float acc[kItems][8];
#pragma unroll
    for (int u = 0; u < kItems; ++u) {
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[u][k] = 0.f;
    }
    for (int n = 0; n < nodes; ++n) {
      float4 a[kItems], b[kItems];
      bool here[kItems];
#pragma unroll
      for (int u = 0; u < kItems; ++u) {
        const int item = base + u * blockDim.x;
        const int t = first + item / vectors;
        here[u] = item < total && partial_present(p, n, t);
        if (here[u]) {
          const float4* src = reinterpret_cast<const float4*>(
                                  partial_row(p, n, t, p.net_partials, p.partials, p.hidden)) +
                              2 * (item % vectors);
          a[u] = src[0];
          b[u] = src[1];
        }
      }
#pragma unroll
      for (int u = 0; u < kItems; ++u) {
        if (!here[u]) continue;
        acc[u][0] += a[u].x, acc[u][1] += a[u].y, acc[u][2] += a[u].z, acc[u][3] += a[u].w;
        acc[u][4] += b[u].x, acc[u][5] += b[u].y, acc[u][6] += b[u].z, acc[u][7] += b[u].w;
      }
    }
#pragma unroll
    for (int u = 0; u < kItems; ++u) {
      const int item = base + u * blockDim.x;
      if (item >= total) continue;
      const int t = first + item / vectors;
      reinterpret_cast<uint4*>(p.out + int64_t(t) * p.hidden)[item % vectors] = to_bf16(acc[u]);
    }
  }
  if (p.out_probs == nullptr) return;
  const int cols = nodes * p.prob_cols;
  for (int item = threadIdx.x; item < (last - first) * cols; item += blockDim.x) {
    const int t = first + item / cols;
    const int col = item % cols;
    const int n = col / p.prob_cols;
    float value = 0.f;
    if (partial_present(p, n, t)) {
      value = partial_row(p, n, t, p.net_partial_probs, p.partial_probs,
                          p.prob_cols)[col % p.prob_cols];
    }
    p.out_probs[int64_t(t) * cols + col] = value;
  }
}

__global__ void __launch_bounds__(kThreads) combine_network_kernel(CombineNetworkParams p) {
  const DomainView& d = p.domain;
  if (d.aborted()) return;
  extern __shared__ __align__(16) uint8_t smem[];
  TokenRun* runs = reinterpret_cast<TokenRun*>(smem);
  send_partials(p, runs, threadIdx.x / 32, threadIdx.x % 32);
  // Every chunk's flags are consumed each call (monotonic counters), also past this rank's
  // tokens.
  for (int c = blockIdx.x; c < p.max_chunks; c += gridDim.x) {
    const int n = threadIdx.x;
    if (n < d.nodes && n != d.node_rank) {
      const size_t slot = p.combine_flags + sizeof(uint64_t) * (size_t(n) * p.max_chunks + c);
      wait_flag(reinterpret_cast<const uint64_t*>(d.self() + slot), d.expected_for(slot), d,
                WaitSite::kNetworkCombine, n, c);
    }
    __syncthreads();  // after a timeout the sums are garbage; the buffer is unusable anyway
    const int first = min(c * p.chunk, p.num_tokens);
    reduce_chunk(p, first, min(first + p.chunk, p.num_tokens));
  }
}

}  // namespace

void launch_combine_network(const CombineNetworkParams& p, int blocks, cudaStream_t stream) {
  const size_t smem = sizeof(TokenRun) * size_t(kWarps) * ((p.chunk + 1) / 2);
  allow_dynamic_smem(reinterpret_cast<const void*>(combine_network_kernel), smem);
  combine_network_kernel<<<blocks, kThreads, smem, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hybrid_ep

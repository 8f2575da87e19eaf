// The other domains, numbered k = 0 .. N-2 skipping this rank's own: the column order of
// attn_to_rdma_map, and the order the network senders walk them in.
#pragma once

namespace hybrid_ep {

__host__ __device__ __forceinline__ int other_domain(int k, int node_rank) {
  return k < node_rank ? k : k + 1;
}

// The inverse: domain n's number among the other domains (n != node_rank).
__host__ __device__ __forceinline__ int other_domain_index(int n, int node_rank) {
  return n < node_rank ? n : n - 1;
}

}  // namespace hybrid_ep

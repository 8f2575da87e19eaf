#include <algorithm>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/executor/executor.h"

namespace hybrid_ep {
namespace {

// The all-gather's blocks that stage this rank's bits for the other domains: about 16 words per
// thread of 512, at most the preprocessing's SM count.
int staging_blocks(const RuntimeConfig& c, int64_t words) {
  if (c.nodes == 1) return 0;
  const int64_t work = int64_t(c.nodes - 1) * c.max_tokens * words;
  return int(std::clamp<int64_t>((work + 512 * 16 - 1) / (512 * 16), 1, c.sms_preprocessing));
}

}  // namespace

void run_preprocess(Runtime& runtime, const PreprocessCall& call, cudaStream_t stream) {
  const RuntimeConfig& c = runtime.config();
  const BufferLayout& l = runtime.layout();
  const BufferShape& shape = runtime.shape();
  const FlagTables flags = l.flag_tables(shape);
  AllgatherParams gather{};
  gather.domain = runtime.domain();
  gather.routing_map = call.routing_map;
  gather.num_tokens = call.num_tokens;
  gather.max_tokens = c.max_tokens;
  gather.domain_cols = int(shape.prob_cols());
  gather.routing_words = int(shape.routing_words());
  gather.staging_blocks = staging_blocks(c, shape.routing_words());
  gather.routing = l.routing;
  gather.staged_routing = l.staged_routing;
  gather.token_counts = l.token_counts;
  gather.call_stamps = l.call_stamps;
  gather.barrier_flags = flags.barrier;
  gather.barrier_stamps = l.barrier_stamps;
  launch_allgather(gather, stream);
  if (c.nodes > 1) {
    AllgatherNetworkParams net{};
    net.domain = gather.domain;
    net.transport = runtime.control_transport();
    net.max_tokens = c.max_tokens;
    net.routing_words = gather.routing_words;
    net.routing = l.routing;
    net.staged_routing = l.staged_routing;
    net.token_counts = l.token_counts;
    net.call_stamps = l.call_stamps;
    net.net_barrier_flags = flags.net_barrier;
    net.net_barrier_stamps = l.net_barrier_stamps;
    net.forward_flags = flags.forward;
    launch_allgather_network(net, stream);
  }

  MetadataParams meta{};
  meta.domain = gather.domain;
  meta.routing = reinterpret_cast<const uint32_t*>(runtime.registered() + l.routing);
  meta.staged_routing =
      c.nodes > 1 ? reinterpret_cast<const uint32_t*>(runtime.registered() + l.staged_routing)
                  : nullptr;
  meta.routing_words = gather.routing_words;
  meta.token_counts = reinterpret_cast<const uint64_t*>(runtime.registered() + l.token_counts);
  meta.call_stamps = reinterpret_cast<const uint64_t*>(runtime.registered() + l.call_stamps);
  meta.max_tokens = c.max_tokens;
  meta.max_received = int(runtime.shape().max_received);
  meta.experts_per_rank = c.experts_per_rank;
  meta.dest_masks = runtime.dest_masks();
  meta.sparse_to_dense_map = call.sparse_to_dense_map;
  meta.rdma_to_attn_map = call.rdma_to_attn_map;
  meta.attn_to_rdma_map = call.attn_to_rdma_map;
  meta.num_dispatched_tokens = call.num_dispatched_tokens;
  meta.local_expert_routing_map = call.local_expert_routing_map;
  meta.dense_chunk_layout = call.dense_chunk_layout;
  meta.dropped_rows = call.dropped_rows;
  meta.chunk = c.dispatch_chunk;
  meta.summary = runtime.device_summary();
  launch_metadata(meta, c.sms_preprocessing, stream);
}

}  // namespace hybrid_ep

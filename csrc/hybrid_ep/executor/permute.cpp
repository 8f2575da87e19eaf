#include "hybrid_ep/executor/executor.h"

namespace hybrid_ep {

void run_permute_layout(Runtime& runtime, const PermuteLayoutCall& call, cudaStream_t stream) {
  PermuteLayoutParams p{};
  p.local_expert_routing_map = call.local_expert_routing_map;
  p.rows = call.rows;
  p.experts_per_rank = runtime.config().experts_per_rank;
  p.pad_multiple = call.pad_multiple;
  p.num_permuted = call.num_permuted;
  p.dense_to_expert_map = call.dense_to_expert_map;
  p.row_source = call.row_source;
  p.raw_tokens_per_expert = call.raw_tokens_per_expert;
  p.tokens_per_expert = call.tokens_per_expert;
  p.overflow = call.overflow;
  launch_permute_layout(p, call.blocks, stream);
}

void run_permute(Runtime& runtime, const PermuteCall& call, cudaStream_t stream) {
  const RuntimeConfig& c = runtime.config();
  const BufferLayout& l = runtime.layout();
  const BufferShape& s = runtime.shape();
  const uint8_t* base = runtime.registered();
  PermuteParams p{};
  p.rows = base + l.dispatch_rows;
  p.probs = call.with_probs ? reinterpret_cast<const float*>(base + l.dispatch_probs) : nullptr;
  p.scales =
      call.scale_cols > 0 ? reinterpret_cast<const float*>(base + l.dispatch_scales) : nullptr;
  p.row_source = call.row_source;
  p.num_permuted = call.num_permuted;
  p.row_bytes = call.row_bytes;
  p.prob_cols = int(s.prob_cols());
  p.prob_col_offset = c.local_rank * c.experts_per_rank;
  p.experts_per_rank = c.experts_per_rank;
  p.scale_cols = call.scale_cols;
  p.out = call.out;
  p.out_probs = call.out_probs;
  p.out_scales = call.out_scales;
  launch_permute(p, call.blocks, stream);
}

}  // namespace hybrid_ep

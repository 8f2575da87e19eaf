#include "hybrid_ep/executor/executor.h"
#include "hybrid_ep/runtime/cuda_check.h"

namespace hybrid_ep {

void run_combine(Runtime& runtime, const CombineCall& call, cudaStream_t stream) {
  const RuntimeConfig& c = runtime.config();
  const BufferLayout& l = runtime.layout();
  const BufferShape& s = runtime.shape();
  const BarrierParams barrier{runtime.domain(), l.barrier_flags};
  const int row_bytes = call.hidden_size * 2;
  // Peers may still be pulling from this rank's combine buffer (an earlier combine).
  launch_domain_barrier(barrier, stream);
  uint8_t* base = runtime.registered();
  if (call.num_rows > 0) {
    HYBRID_EP_CUDA_CHECK(cudaMemcpyAsync(base + l.combine_rows, call.hidden,
                                         size_t(call.num_rows) * row_bytes,
                                         cudaMemcpyDeviceToDevice, stream));
    if (call.probs != nullptr) {
      HYBRID_EP_CUDA_CHECK(cudaMemcpyAsync(base + l.combine_probs, call.probs,
                                           size_t(call.num_rows) * s.prob_cols() * sizeof(float),
                                           cudaMemcpyDeviceToDevice, stream));
    }
  }
  // Every peer's rows are staged before anyone pulls.
  launch_domain_barrier(barrier, stream);
  CombineParams p{};
  p.domain = barrier.domain;
  p.sparse_to_dense_map = call.sparse_to_dense_map;
  p.num_tokens = call.num_tokens;
  p.row_bytes = row_bytes;
  p.hidden = call.hidden_size;
  p.prob_cols = int(s.prob_cols());
  p.experts_per_rank = c.experts_per_rank;
  p.chunk = c.combine_chunk;
  const int prob_bytes =
      call.out_probs != nullptr && (c.experts_per_rank * 4) % 16 == 0 ? c.experts_per_rank * 4 : 0;
  p.stages = runtime.combine_stages(combine_stage_bytes(row_bytes, prob_bytes));
  p.combine_rows = l.combine_rows;
  p.combine_probs = l.combine_probs;
  p.out = call.out;
  // Not keyed on call.probs: an empty probs tensor has a null data pointer, and its combined
  // probs (all zero) must still be written.
  p.out_probs = call.out_probs;
  p.probs_by_tma = prob_bytes != 0;
  launch_combine(p, c.sms_combine, stream);
}

}  // namespace hybrid_ep

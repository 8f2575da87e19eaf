#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/executor/executor.h"

namespace hybrid_ep {

// Dispatch rows per work item of a fused permute block. The permute role is bound by HBM
// writes, so blocks that finish early leave bandwidth to the others: 4-row items (8 per block
// at one rank) measured no better than 16-row ones (185.9 vs 184.6 us), which cost fewer flag
// waits.
constexpr int kFusedPermuteSlice = 16;
static_assert(kFusedPermuteSlice <= 32, "a permute item's rows are found one per lane");

namespace {

// Offset of `bytes` at `address` from the registered base, checked to lie in one live block of
// the zero-copy pool.
uint64_t pool_offset(const Runtime& runtime, const void* address, size_t bytes, const char* what) {
  if (!runtime.pool() || !runtime.pool()->holds(address, bytes)) {
    throw std::invalid_argument(std::string("dispatch: zero-copy ") + what +
                                " outside this buffer's zero-copy pool");
  }
  return uint64_t(static_cast<const uint8_t*>(address) - runtime.registered());
}

// Where this call's rows land in this rank's buffer (its receive regions, or the zero-copy
// outputs), then the release the peers wait for before they read it, then the wait for theirs.
void publish_dispatch_targets(Runtime& runtime, const DispatchCall& call, cudaStream_t stream) {
  const BufferLayout& l = runtime.layout();
  using T = ReceiveTargets;
  ReceiveTargetWords w{};
  w.count = T::kDispatchWords;
  const ZeroCopyOutputs& z = call.zero_copy;
  if (z.rows != nullptr) {
    const size_t rows = size_t(std::max<int64_t>(z.capacity, 0));
    w.at[T::kDispatchRows] = pool_offset(runtime, z.rows, rows * call.row_bytes, "rows");
    w.at[T::kDispatchProbs] =
        z.probs == nullptr
            ? l.dispatch_probs
            : pool_offset(runtime, z.probs, rows * runtime.shape().prob_cols() * sizeof(float),
                          "probs");
    w.at[T::kDispatchScales] =
        z.scales == nullptr
            ? l.dispatch_scales
            : pool_offset(runtime, z.scales, rows * call.scale_cols * sizeof(float), "scales");
    w.at[T::kDispatchCapacity] = uint64_t(rows);
  } else {
    w.at[T::kDispatchRows] = l.dispatch_rows;
    w.at[T::kDispatchProbs] = l.dispatch_probs;
    w.at[T::kDispatchScales] = l.dispatch_scales;
    w.at[T::kDispatchCapacity] = uint64_t(INT64_MAX);  // metadata keeps rows within the region
  }
  launch_publish_dispatch(runtime.domain(), l.receive_targets, w, l.receive_releases, stream);
}

}  // namespace

size_t run_dispatch(Runtime& runtime, const DispatchCall& call, cudaStream_t stream) {
  const RuntimeConfig& c = runtime.config();
  const BufferLayout& l = runtime.layout();
  const BufferShape& s = runtime.shape();
  if (call.barrier_first && c.nodes > 1) launch_domain_barrier(runtime.barrier(), stream);
  DispatchParams p{};
  if (c.nodes > 1 && call.zero_copy.rows != nullptr) {
    throw std::invalid_argument("dispatch: zero-copy outputs only inside one domain");
  }
  if (c.nodes == 1 && runtime.domain().ranks > 1) {
    publish_dispatch_targets(runtime, call, stream);
    p.published_targets = true;
    p.receive_targets = l.receive_targets;
  }
  p.domain = runtime.domain();
  p.transport = runtime.transport();
  p.channels = c.channels;
  p.attn_to_rdma_map = call.attn_to_rdma_map;
  p.hidden = call.hidden;
  p.probs = call.probs;
  p.scales = call.scales;
  p.sparse_to_dense_map = call.sparse_to_dense_map;
  p.num_tokens = call.num_tokens;
  const int T = runtime.handle_tokens(call.handle_tokens);
  p.max_tokens = T;
  p.row_bytes = call.row_bytes;
  p.prob_cols = int(s.prob_cols());
  p.prob_col_offset = c.node_rank * p.prob_cols;
  p.experts_total = int(s.experts_total());
  p.scale_cols = call.scale_cols;
  p.chunk = c.dispatch_chunk;
  p.max_chunks = (T + c.dispatch_chunk - 1) / c.dispatch_chunk;
  p.side_by_tma = dispatch_side_data_by_tma(p);
  // Before the stages: an eager record's side data takes room in every stage.
  p.eager = s.eager;
  p.eager_slot_bytes = s.eager_slot_bytes();
  p.eager_epoch = l.eager_epoch;
  p.eager_staging = l.eager_rows_staging;
  p.stages = runtime.dispatch_stages(dispatch_stage_bytes(p));
  p.dispatch_rows = l.dispatch_rows;
  p.dispatch_probs = l.dispatch_probs;
  p.dispatch_scales = l.dispatch_scales;
  const FlagTables flags = l.flag_tables(s);
  p.dispatch_flags = flags.dispatch.with_chunks(p.max_chunks);
  p.net_rows = l.net_rows;
  p.net_probs = l.net_probs;
  p.net_scales = l.net_scales;
  p.network_flags = flags.network.with_chunks(p.max_chunks);
  p.ring_chunks = int(s.net_ring_chunks);
  p.dispatch_credits = flags.dispatch_credits.with_chunks(p.max_chunks);
  p.control = runtime.control_transport();
  p.withhold_credits = c.withhold_dispatch_credits;
  if (c.nodes > 1 && call.probs != nullptr) {
    // The network leg puts a run's probs for one domain at once: restripe them dest-major.
    float* restriped = reinterpret_cast<float*>(runtime.registered() + l.restriped_probs);
    launch_restripe({call.probs, restriped, std::min(call.num_tokens, T), T, c.nodes, p.prob_cols},
                    stream);
    p.restriped_probs = restriped;
    p.prob_puts_per_token = c.prob_puts_per_token;
  }
  p.net_hidden = call.hidden;
  p.net_scales_src = call.scales;
  const size_t tokens = size_t(std::max(0, std::min(call.num_tokens, T)));
  size_t staged = 0;
  if (c.nodes > 1 && tokens > 0) {
    p.net_hidden = static_cast<const uint8_t*>(network_source(
        runtime, call.hidden, tokens * call.row_bytes, l.staged_rows, stream, staged));
    if (call.scales != nullptr) {
      p.net_scales_src = static_cast<const float*>(
          network_source(runtime, call.scales, tokens * call.scale_cols * sizeof(float),
                         l.staged_scales, stream, staged));
    }
  }
  if (call.own.rows != nullptr) {
    if (c.nodes > 1 || call.permute != nullptr) {
      throw std::invalid_argument(
          "dispatch: own rows straight into the output only inside one domain, unpermuted");
    }
    p.own = call.own;
  } else if (c.nodes == 1 && !p.published_targets && call.zero_copy.rows != nullptr) {
    // Alone every row is this rank's own: the zero-copy outputs (sized for all of them) take
    // them as its own rows, with no publish kernel before the launch.
    p.own = {call.zero_copy.rows, call.zero_copy.probs, call.zero_copy.scales};
  }
  p.dispatch_blocks = c.sms_dispatch;
  p.first_permute_block = c.sms_dispatch;
  if (call.permute != nullptr && call.permute->blocks > 0) {
    const FusedPermuteCall& f = *call.permute;
    if (c.nodes == 1) {
      // Every block of the grid sends a share of the chunks, then permutes: with the send left
      // to the dispatch SMs alone, the permute blocks' traffic slowed it down and they waited
      // for its chunks (timeline at one rank: 225 of 246 us sending, 207 us of each permute
      // block's time waiting). With several domains the network sends stay on the dispatch
      // blocks that the transport was sized for.
      p.dispatch_blocks = p.permute_blocks = c.sms_dispatch + f.blocks;
      p.first_permute_block = 0;
    } else {
      p.permute_blocks = f.blocks;
    }
    p.permute = {f.chunk_layout,     f.dense_to_expert_map,
                 f.row_source,       f.num_permuted,
                 c.experts_per_rank, c.local_rank * c.experts_per_rank,
                 kFusedPermuteSlice, f.out,
                 f.out_probs,        f.out_scales};
  }
  launch_dispatch(p, stream);
  return staged;
}

void copy_dispatched(Runtime& runtime, const DispatchOutput& out, cudaStream_t stream) {
  const BufferLayout& l = runtime.layout();
  const uint8_t* base = runtime.registered();
  const int rows = out.rows_count;
  RowCopies copies;
  copies.add_outside(out.rows, base + l.dispatch_rows, out.row_bytes, rows, out.written);
  if (out.probs != nullptr) {
    copies.add_outside(out.probs, base + l.dispatch_probs,
                       runtime.shape().prob_cols() * sizeof(float), rows, out.written);
  }
  if (out.scales != nullptr) {
    copies.add_outside(out.scales, base + l.dispatch_scales, out.scale_cols * sizeof(float), rows,
                       out.written);
  }
  copies.launch(runtime, stream);
}

}  // namespace hybrid_ep

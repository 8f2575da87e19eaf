#include <stdexcept>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/executor/executor.h"

namespace hybrid_ep {
namespace {

// The unpermute of this rank's expert outputs into its registered combine region.
UnpermuteParams unpermute_params(Runtime& runtime, const CombineCall& call) {
  const RuntimeConfig& c = runtime.config();
  const BufferLayout& l = runtime.layout();
  uint8_t* base = runtime.registered();
  UnpermuteParams u{};
  u.hidden = reinterpret_cast<const uint16_t*>(call.hidden);
  u.probs = call.probs;
  u.dense_to_expert_map = call.dense_to_expert_map;
  u.num_dispatched = call.num_dispatched;
  u.hidden_size = call.hidden_size;
  u.experts_per_rank = c.experts_per_rank;
  u.prob_cols = int(runtime.shape().prob_cols());
  u.prob_col_offset = c.local_rank * c.experts_per_rank;
  u.dense = reinterpret_cast<float*>(base + l.combine_rows);
  u.dense_probs = call.with_probs ? reinterpret_cast<float*>(base + l.combine_probs) : nullptr;
  return u;
}

// Which of the combine input's parts the peers pull where they are: rows already in the
// combine region (written there by the caller), and inside one domain rows or probs in the
// zero-copy pool.
struct InPlace {
  bool rows = false, probs = false;
};

// The copy of this rank's combine input into its registered buffer: the rows as they are (but
// the rows of its own tokens that the kernel reads in place, call.own, and what is `in_place`),
// or (the unpermute path) every dispatch row's fp32 sum of its expert outputs.
class Staging {
 public:
  Staging(Runtime& runtime, const CombineCall& call, InPlace in_place) : call_(call) {
    unpermute_ = call.dense_to_expert_map != nullptr;
    if (unpermute_ || call.num_rows == 0) return;
    const BufferLayout& l = runtime.layout();
    const BufferShape& s = runtime.shape();
    uint8_t* base = runtime.registered();
    const size_t staged_rows = size_t(call.num_rows - call.own.size());
    if (!in_place.rows) {
      copies_.add_outside(base + l.combine_rows, call.hidden, size_t(call.hidden_size) * 2,
                          call.num_rows, call.own);
      bytes_ += staged_rows * size_t(call.hidden_size) * 2;
    }
    if (call.probs != nullptr && !in_place.probs) {
      copies_.add_outside(base + l.combine_probs, call.probs, s.prob_cols() * sizeof(float),
                          call.num_rows, call.own);
      bytes_ += staged_rows * s.prob_cols() * sizeof(float);
    }
  }
  // Whether launch() writes this rank's combine region.
  bool writes() const { return unpermute_ || bytes_ > 0; }
  size_t bytes() const { return bytes_; }  // copied (the unpermute's sums are not counted)
  void launch(Runtime& runtime, cudaStream_t stream) const {
    if (unpermute_) {
      launch_unpermute(unpermute_params(runtime, call_), call_.unpermute_blocks, stream);
    } else {
      copies_.launch(runtime, stream);
    }
  }

 private:
  const CombineCall& call_;
  bool unpermute_ = false;
  RowCopies copies_;
  size_t bytes_ = 0;
};

// Inside one domain: where the peers find this call's input rows and probs (offsets from the
// registered base), read by their kernels after the barrier that follows the staging.
ReceiveTargetWords combine_sources(Runtime& runtime, const CombineCall& call, InPlace in_place) {
  const BufferLayout& l = runtime.layout();
  uint8_t* base = runtime.registered();
  ReceiveTargetWords w{};
  w.count = ReceiveTargets::kCombineWords;
  w.at[0] = in_place.rows && call.hidden != base + l.combine_rows ? uint64_t(call.hidden - base)
                                                                  : l.combine_rows;
  w.at[1] = in_place.probs ? uint64_t(reinterpret_cast<const uint8_t*>(call.probs) - base)
                           : l.combine_probs;
  return w;
}

}  // namespace

void claim_combine_input(Runtime& runtime, cudaStream_t stream) {
  if (runtime.config().nodes > 1) {
    launch_domain_barrier(runtime.barrier(), stream);
  } else {
    launch_wait_pulled(runtime.domain(), runtime.layout().combine_pulled, stream);
  }
}

size_t run_combine(Runtime& runtime, const CombineCall& call, cudaStream_t stream) {
  const int T = runtime.handle_tokens(call.handle_tokens);  // forwarded tokens are n * T + t
  const RuntimeConfig& c = runtime.config();
  const BufferLayout& l = runtime.layout();
  const BufferShape& s = runtime.shape();
  const BarrierParams barrier = runtime.barrier();
  const bool own_in_place = call.own.size() > 0;
  if (own_in_place && (c.nodes > 1 || call.dense_to_expert_map != nullptr)) {
    throw std::invalid_argument(
        "combine: own rows read in place only inside one domain, without unpermute");
  }
  if (own_in_place && reinterpret_cast<uintptr_t>(call.hidden) % 16 != 0) {
    throw std::invalid_argument("combine: hidden must be 16-byte aligned to be read in place");
  }
  const bool rows_in_place = call.hidden == runtime.registered() + l.combine_rows;
  if (rows_in_place && (!call.claimed || call.dense_to_expert_map != nullptr)) {
    throw std::invalid_argument(
        "combine: hidden is this rank's combine region, which only a plain combine right after "
        "claim_combine_input may read in place");
  }
  // With several domains peers may still be pulling from this rank's combine buffer (an
  // earlier combine), unless claim_combine_input waited for them already. Inside one domain
  // each rank counts the combines it has pulled from each peer (combine_pulled): a rank waits
  // until every peer has pulled its previous input before it republishes or restages, and a
  // rank whose input the peers read in place from the zero-copy pool (the caller's own tensor,
  // which it may reuse once the call returns) also waits after the kernel.
  const bool one_domain = c.nodes == 1;
  // Alone the kernel reads its input where it is (call.own) or from the combine region: there
  // are no peers to publish sources to, and the stream orders every reuse.
  const bool publishes = one_domain && barrier.domain.ranks > 1;
  if (!one_domain && !call.claimed) launch_domain_barrier(barrier, stream);
  const bool fused = call.dense_to_expert_map != nullptr && call.fused_unpermute_blocks > 0;
  InPlace in_place{rows_in_place, false};
  bool from_pool = false;  // some of the input is read in place from the caller's pool tensor
  const bool plain = call.dense_to_expert_map == nullptr;
  if (publishes && plain && runtime.pool() && call.num_rows > 0) {
    const size_t rows = size_t(call.num_rows);
    // The peers' bulk copies read 16-byte aligned rows.
    const bool pool_rows = reinterpret_cast<uintptr_t>(call.hidden) % 16 == 0 &&
                           runtime.pool()->holds(call.hidden, rows * size_t(call.hidden_size) * 2);
    in_place.rows |= pool_rows;
    in_place.probs = call.probs != nullptr &&
                     runtime.pool()->holds(call.probs, rows * s.prob_cols() * sizeof(float));
    from_pool = pool_rows || in_place.probs;
  }
  // Before this call republishes its sources or writes its region (claim_combine_input waited
  // already): the peers' reads of the previous call's are done.
  const bool wait_first = one_domain && !call.claimed;
  size_t staged = 0;
  if (fused) {
    // The fused path has no barrier after it to publish through: its rows are in the region.
    if (wait_first) launch_wait_pulled(barrier.domain, l.combine_pulled, stream);
  } else {
    const Staging staging(runtime, call, in_place);
    staged = staging.bytes();
    // A staging copy writes the region: the wait goes before it, else into the start kernel.
    if (wait_first && staging.writes()) {
      launch_wait_pulled(barrier.domain, l.combine_pulled, stream);
    }
    staging.launch(runtime, stream);
    // Every peer's rows are staged (and its sources published) before anyone pulls.
    if (publishes) {
      uint8_t* base = runtime.registered();
      launch_combine_start(
          barrier, l.combine_pulled, wait_first && !staging.writes(),
          reinterpret_cast<uint64_t*>(base + l.receive_targets) + ReceiveTargets::kCombineRows,
          combine_sources(runtime, call, in_place), stream);
    } else {
      launch_domain_barrier(barrier, stream);
    }
  }
  CombineParams p{};
  p.published_sources = publishes && !fused;
  p.receive_targets = l.receive_targets;
  p.combine_blocks = c.sms_combine;
  p.first_unpermute_block = c.sms_combine;
  if (fused) {  // unpermute blocks in the combine grid; the loader waits per chunk instead
    if (c.nodes == 1) {
      // Every block unpermutes its share, then combines its chunks: the combine blocks alone
      // (SM-bound) would start only as the unpermute blocks finish, the same pattern as the
      // fused dispatch's (see run_dispatch). With several domains the partial sums and the
      // network step stay with the combine blocks.
      p.combine_blocks = p.unpermute_blocks = c.sms_combine + call.fused_unpermute_blocks;
      p.first_unpermute_block = 0;
    } else {
      p.unpermute_blocks = call.fused_unpermute_blocks;
    }
    const int chunks = (T + c.dispatch_chunk - 1) / c.dispatch_chunk;
    p.unpermute = {unpermute_params(runtime, call),
                   call.chunk_layout,
                   c.dispatch_chunk,
                   chunks,
                   T,
                   l.flag_tables(s).unpermute.with_chunks(chunks)};
  }
  p.domain = barrier.domain;
  p.sparse_to_dense_map = call.sparse_to_dense_map;
  p.num_tokens = call.num_tokens;
  p.hidden = call.hidden_size;
  p.fp32_input = call.dense_to_expert_map != nullptr;
  p.prob_cols = int(s.prob_cols());
  p.experts_per_rank = c.experts_per_rank;
  p.chunk = runtime.combine_chunk();
  p.combine_rows = l.combine_rows;
  p.combine_probs = l.combine_probs;
  p.out = call.out;
  if (own_in_place) {
    p.own_rows = call.hidden;
    p.own_probs = call.probs;
  }
  // Not keyed on call.probs: an empty probs tensor has a null data pointer, and its combined
  // probs (all zero) must still be written.
  p.out_probs = call.out_probs;
  if (c.nodes > 1) {
    // Partials of every forwarded token, put to their sources as each chunk is reduced, and
    // the final sums of this rank's tokens, all in this launch. Keyed on with_probs, not on the
    // output pointer: a rank without tokens (empty output) still reduces its peers' probs.
    uint8_t* base = runtime.registered();
    p.partial = true;
    p.num_tokens = c.nodes * T;
    CombineAcross& a = p.across;
    a.transport = runtime.transport();
    a.rdma_to_attn_map = call.rdma_to_attn_map;
    a.attn_to_rdma_map = call.attn_to_rdma_map;
    a.max_tokens = T;
    a.max_chunks = (T + p.chunk - 1) / p.chunk;
    a.out_tokens = call.num_tokens;
    a.channels = c.channels;
    a.bf16_wire = !c.combine_wire_fp32;
    a.partials = base + l.partials;
    a.partial_probs = call.with_probs ? reinterpret_cast<float*>(base + l.partial_probs) : nullptr;
    a.partials_at = l.partials;
    a.partial_probs_at = l.partial_probs;
    a.net_partials = l.net_partials;
    a.net_partial_probs = l.net_partial_probs;
    const FlagTables flags = l.flag_tables(s);
    a.combine_flags = flags.combine.with_chunks(a.max_chunks);
    a.ring_chunks = int(s.net_ring_chunks);
    a.combine_credits = flags.combine_credits.with_chunks(a.max_chunks);
    a.control = runtime.control_transport();
    a.withhold_credits = c.withhold_combine_credits;
    a.eager = s.eager;
    a.eager_slot_bytes = s.combine_eager_slot_bytes();
    a.eager_staging = l.eager_partials_staging;
    // The combine's epoch words follow the dispatch's.
    a.eager_epoch = l.eager_epoch + BufferLayout::kEagerEpochWords * sizeof(uint64_t);
  }
  // Whole rows when every copy of a row plus a prefetch fits the ring, else halves, quarters...
  // (or what HYBRID_EP_COMBINE_PIECES asks for, where the hidden size splits so).
  p.pieces = 1;
  if (c.combine_pieces > 0 && p.hidden % (8 * c.combine_pieces) == 0) {
    p.pieces = c.combine_pieces;
  } else {
    while (!runtime.combine_fits(combine_stage_bytes(p)) && p.hidden % (16 * p.pieces) == 0) {
      p.pieces *= 2;
    }
  }
  p.stages = runtime.combine_stages(combine_stage_bytes(p));
  launch_combine(p, stream);
  // Every peer has pulled from the caller's pool tensor before the caller may touch it again.
  if (one_domain) launch_combine_end(barrier.domain, l.combine_pulled, from_pool, stream);
  return staged;
}

}  // namespace hybrid_ep

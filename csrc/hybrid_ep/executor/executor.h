// One function per API step: preprocess -> core kernel -> postprocess, sequenced on the
// caller's stream. No host synchronisation in here; the caller decides when to wait.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "hybrid_ep/runtime/runtime.h"

namespace hybrid_ep {

// Rows [begin, end) of a rank's dispatch order.
struct RowRange {
  int begin = 0;
  int end = 0;
  int size() const { return end > begin ? end - begin : 0; }
};

struct PreprocessCall {
  const uint8_t* routing_map;  // bool [num_tokens, E_total]
  int num_tokens;
  // Handle outputs (docs/semantics.md), allocated by the caller; the maps zero-filled.
  int32_t* sparse_to_dense_map;
  bool* rdma_to_attn_map;
  bool* attn_to_rdma_map;
  int32_t* num_dispatched_tokens;
  bool* local_expert_routing_map;
  int32_t* dense_chunk_layout;  // [W*C + 1] or null
  int32_t* dropped_rows;        // [1] or null: rows routed to this rank past its receive cap
};

// All-gather the routing over the domain, then the metadata kernels. Afterwards
// runtime.host_summary() holds the dispatched rows, the largest token count of any rank, the
// rows routed to each rank of this domain and the range of this rank's own rows, once the
// stream reaches this point.
void run_preprocess(Runtime& runtime, const PreprocessCall& call, cudaStream_t stream);

// A dispatch's outputs in the zero-copy pool: [capacity, row bytes] rows and their probs and
// scales (either null when not dispatched); rows past `capacity` are not stored.
struct ZeroCopyOutputs {
  uint8_t* rows = nullptr;
  float* probs = nullptr;
  float* scales = nullptr;
  int64_t capacity = 0;
};

struct DispatchCall {
  const uint8_t* hidden;  // [num_tokens, row_bytes]
  const float* probs;     // [num_tokens, E_total] or null
  const float* scales;    // [num_tokens, hidden / 128] or null
  const int32_t* sparse_to_dense_map;
  const bool* attn_to_rdma_map;  // handle entry 2 (several domains)
  // T of the handle: the buffer's tokens per rank when the handle was made (a buffer may have
  // grown since); with several domains the forwarded token n * T + t is indexed with it.
  int handle_tokens;
  int num_tokens;
  int row_bytes;
  int scale_cols;
  // Needed when no preprocessing ran in this operation, with several domains (inside one the
  // publish kernel before the launch waits for each peer's release of its receive region).
  bool barrier_first;
  // Inside one domain, the caller's output for this rank's rows from itself, at their row
  // index (rows, probs, scales; null: through the registered buffer like the peers' rows).
  OwnDispatchRows own{};
  // dispatch_with_permute fused (fuse_permute_dispatch): the expert-major outputs, written by
  // extra blocks of the dispatch grid; null for a plain dispatch.
  const struct FusedPermuteCall* permute = nullptr;
  // Inside one domain, outputs in this rank's zero-copy pool that the peers store into
  // directly (null rows: its registered receive regions, then copy_dispatched).
  ZeroCopyOutputs zero_copy{};
};

struct FusedPermuteCall {
  const int32_t* chunk_layout;         // handle entry 5 (dense_chunk_layout)
  const int32_t* dense_to_expert_map;  // from run_permute_layout
  const int32_t* row_source;           // from run_permute_layout
  int num_permuted;
  int blocks;    // permute blocks after the dispatch blocks
  uint8_t* out;  // [num_permuted, row_bytes]
  // Whether probs and scales come along is keyed on these, never on this rank's input
  // pointers: a rank without tokens passes empty tensors (null), yet receives its peers'.
  float* out_probs;   // [num_permuted] or null
  float* out_scales;  // [num_permuted, scale_cols] or null
};

// Rows land in the registered buffers of their destination ranks, or inside one domain in
// the zero-copy outputs each destination published. Inside one domain of several ranks every
// dispatch starts by publishing this rank's targets and releasing its receive region: its reads
// of the previous dispatch's rows (copy_dispatched, run_permute, the fused permute) are behind
// in stream order. Alone, the zero-copy outputs are its own rows' targets: nothing to publish.
// Returns the bytes staged for the network's puts (network_source).
size_t run_dispatch(Runtime& runtime, const DispatchCall& call, cudaStream_t stream);

struct DispatchOutput {
  uint8_t* rows;  // [rows, row_bytes]
  float* probs;   // [rows, E*R] or null
  float* scales;  // [rows, scale_cols] or null
  int rows_count;
  int row_bytes;
  int scale_cols;
  RowRange written;  // rows the dispatch wrote into these tensors already (DispatchCall::own)
};

// Copies this rank's received rows out of the registered buffer into the caller's tensors.
void copy_dispatched(Runtime& runtime, const DispatchOutput& out, cudaStream_t stream);

struct PermuteCall {
  const int32_t* row_source;  // [num_permuted]: dispatch row * E + expert, or -1 (zero row)
  int num_permuted;
  int row_bytes;
  int scale_cols;
  bool with_probs;
  int blocks;
  uint8_t* out;       // [num_permuted, row_bytes]
  float* out_probs;   // [num_permuted] or null
  float* out_scales;  // [num_permuted, scale_cols] or null
};

struct PermuteLayoutCall {
  const bool* local_expert_routing_map;  // handle entry 4, [rows, E]
  int rows;
  int pad_multiple;
  int num_permuted;
  int32_t* dense_to_expert_map;    // [rows, E] out (handle entry 6)
  int32_t* row_source;             // [num_permuted] out (the permute kernel's gather map)
  int32_t* raw_tokens_per_expert;  // [E] out (handle entry 7)
  int64_t* tokens_per_expert;      // [E] out
  int32_t* overflow;               // [1] out (handle entry 10)
  int blocks;
};

// The permuted layout, computed on the device (no host synchronisation).
void run_permute_layout(Runtime& runtime, const PermuteLayoutCall& call, cudaStream_t stream);

// Gathers this rank's received rows (still in its registered buffer) into expert-major order.
void run_permute(Runtime& runtime, const PermuteCall& call, cudaStream_t stream);

struct CombineCall {
  // bf16 [num_rows, H]: this rank's expert outputs, in dispatch order, or in permuted order
  // when dense_to_expert_map is given (then probs are [num_rows]).
  const uint8_t* hidden;
  const float* probs;  // [num_rows, E*R] (or [num_rows], permuted) or null
  // Whether probs were passed. Not keyed on the pointers: an empty tensor (no rows here, or
  // no tokens of this rank) has a null data pointer, yet its peers still read the staged probs.
  bool with_probs;
  int num_rows;
  int hidden_size;
  const int32_t* sparse_to_dense_map;
  const bool* rdma_to_attn_map;  // handle entries 1 and 2 (several domains)
  const bool* attn_to_rdma_map;
  int handle_tokens;  // T of the handle, as in DispatchCall
  int num_tokens;     // tokens of this rank (rows of the outputs)
  uint16_t* out;      // bf16 [num_tokens, H]
  float* out_probs;   // [num_tokens, E_total] or null
  // Unpermute first: handle entries 6 and 3 (dense_to_expert_map, num_dispatched_tokens).
  const int32_t* dense_to_expert_map;
  const int32_t* num_dispatched;
  int unpermute_blocks;
  // Fused unpermute (fuse_unpermute_combine): this many unpermute blocks join the combine grid,
  // working through handle entry 5 (dense_chunk_layout); 0 runs the standalone kernel.
  const int32_t* chunk_layout = nullptr;
  int fused_unpermute_blocks = 0;
  // Inside one domain, the rows of this rank's own tokens (plain combine): read by the kernel
  // from `hidden` and `probs` as they are, so they are not staged.
  RowRange own{};
  // claim_combine_input ran since the last combine: the peers are done with this rank's
  // combine region, so the call skips its first barrier. `hidden` may then be that region
  // itself (the tensor claim_combine_input's caller handed out), whose rows are not copied.
  bool claimed = false;
};

// Barrier, stage this rank's rows into its registered buffer (a copy, or the fp32 unpermute
// sums), barrier, pull-and-reduce kernel; with several domains the same kernel rounds each
// domain's sums to the wire's width, puts each reduced chunk to its tokens' sources and adds
// the domains' partials of this rank's own tokens as they arrive. Inside one domain of several
// ranks the first barrier is a one-way wait for the peers' reads of this rank's previous input
// (combine_pulled), rows and probs that lie in the zero-copy pool are published instead of
// staged (peers pull them in place), and for such an input the same wait follows the kernel;
// without a staging copy the wait, publish and barrier are one launch (launch_combine_start).
// Returns the bytes staged by copy.
size_t run_combine(Runtime& runtime, const CombineCall& call, cudaStream_t stream);

// The first step of a combine, taken early so that the caller may write its expert outputs
// straight into this rank's combine region: waits (on the stream) until every peer has
// finished pulling from it (inside one domain a one-way wait for their counts of it). The next
// run_combine must say `claimed`.
void claim_combine_input(Runtime& runtime, cudaStream_t stream);

// The barrier between operations on its own (barrier.cpp), as a call's starts: every rank of
// the domain (and, with several domains, its peers) meets; no stamp is compared. The bench
// times it as the floor of a call that must meet every rank.
void run_barrier(Runtime& runtime, cudaStream_t stream);

// Copies between the caller's tensors and the registered buffer (buffer_copies.cpp).

// Where a network put may read `bytes` of `source` from: `source` itself, or, when the backend's
// puts read only registered memory (Runtime::needs_registered_sources) and `source` is not in
// the zero-copy pool (registered: the caller's tensor from empty_zero_copy), a copy of it
// enqueued at `registered_offset` of this rank's registered buffer; `staged` counts its bytes.
const void* network_source(Runtime& runtime, const void* source, size_t bytes,
                           size_t registered_offset, cudaStream_t stream, size_t& staged);

// Rows of several tensors copied between the caller's tensors and the registered buffer, all
// in one kernel launch (kernels/segment_copy.cu).
class RowCopies {
 public:
  // `rows` rows of `row_bytes` from `src` to `dst` (same row index), all but those of `skip`:
  // one or two ranges. Throws std::invalid_argument when `skip` is not inside the rows.
  void add_outside(void* dst, const void* src, size_t row_bytes, int rows, RowRange skip);
  void launch(const Runtime& runtime, cudaStream_t stream) const;

 private:
  SegmentCopyParams params_{};
};

// Transport self-test (kernels/transport_check.cu): returns the bytes that arrived wrong or
// not at all from the peers of the other domains. Synchronises the stream. With `times`, also
// the global timer when this rank put to each domain n (times[n]) and saw its signal ([N + n]).
unsigned long long run_transport_check(Runtime& runtime, size_t bytes, int channel,
                                       cudaStream_t stream, std::vector<uint64_t>* times = nullptr);

// Network-leg check (kernels/network_send_check.cu): this rank's rows [num_tokens, row_bytes]
// go to the receive tiles of the peer of every other domain where goes[t, k] says so (runs
// per chunk, one signal per chunk and domain); returns once the peers' chunks have arrived
// here (read them with copy_registered at layout offset net_rows). Synchronises the stream.
void run_network_send_check(Runtime& runtime, const bool* goes, const uint8_t* rows, int num_tokens,
                            int row_bytes, int blocks, cudaStream_t stream);

}  // namespace hybrid_ep

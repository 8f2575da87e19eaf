// Kernel parameters: plain structs of pointers and sizes, shared by the launchers (host) and
// the kernels (device). Peer memory is reached as `peers[j] + offset` (see memory/layout.h), a
// flag as `peers[j] + table.slot(...)` (memory/flag_tables.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "hybrid_ep/kernels/common/domain_view.h"
#include "hybrid_ep/memory/flag_tables.h"
#include "hybrid_ep/transport/transport.h"

namespace hybrid_ep {

// With several domains the barrier also exchanges one signal with the peer of every other
// domain (through the transport), so no peer overwrites tiles this rank still reads.
struct BarrierParams {
  DomainView domain;
  TransportContext transport;  // used when domain.nodes > 1
  RankFlags barrier_flags;
  DomainFlags net_barrier_flags;
  // Region offsets of the stamps the barrier carries, [2][R] and [2][N] (memory/layout.h).
  size_t barrier_stamps;
  size_t net_barrier_stamps;
};

// The routing all-gather moves bits (kernels/common/routing_bits.h): each rank's tokens, only
// the columns of the receiving rank's domain.
struct AllgatherParams {
  DomainView domain;
  const uint8_t* routing_map;  // bool [num_tokens, E_total] of this rank
  int num_tokens;              // rows of this rank (may exceed max_tokens: growth is detected)
  int max_tokens;              // T
  int domain_cols;             // E*R: one domain's columns of the map
  int routing_words;           // words per token and domain
  // Blocks past the domain's R that pack this rank's bits for the other domains into
  // staged_routing (0 with one domain).
  int staging_blocks;
  size_t routing;  // region offsets
  size_t staged_routing;
  size_t token_counts;
  size_t call_stamps;  // uint64 [W]: each rank's stamp, carried like its token count
  // The domain barrier's flags and stamp slots (BarrierParams): the all-gather is this call's
  // barrier, so that a rank in another operation meets it there.
  RankFlags barrier_flags;
  size_t barrier_stamps;
};

// The all-gather's second step with several domains: this rank's bits for each other domain
// (staged_routing) go to its peer there, and the rows those peers send here (this domain's
// bits) are forwarded to the rest of this domain, so every rank ends with all W ranks' rows.
struct AllgatherNetworkParams {
  DomainView domain;
  TransportContext transport;
  int max_tokens;
  int routing_words;
  size_t routing, staged_routing, token_counts, call_stamps;
  DomainFlags net_barrier_flags;  // the barrier's, as in AllgatherParams
  size_t net_barrier_stamps;
  RankFlags forward_flags;
};

// Destination-major probs: probs [num_tokens, N * E*R] -> restriped [N, T, E*R], so that the
// probs of a run of tokens for one destination domain are one contiguous put.
struct RestripeParams {
  const float* probs;
  float* restriped;
  int num_tokens;
  int max_tokens;  // T
  int nodes;
  int prob_cols;  // E*R
};

// What the metadata kernel leaves for the host (host-mapped), read at a blocking call's one
// synchronisation.
struct PreprocessSummary {
  int64_t dispatched;  // rows this rank receives (D, at most the receive cap M)
  int64_t largest;     // the largest token count of any rank (more than T: grow)
  // Rows [own_begin, own_end) of this rank's dispatch order are its own tokens (rows are in
  // source order).
  int64_t own_begin, own_end;
  // Rows routed to each local rank of this domain, before the receive cap (more than M: grow).
  int64_t routed[64];
};

struct MetadataParams {
  DomainView domain;
  // This rank's gathered routing region: uint32 [W*T, routing_words], every token's bits for
  // this domain's experts (kernels/common/routing_bits.h).
  const uint32_t* routing;
  // This rank's own bits for the other domains, [N-1, T, routing_words] (several domains).
  const uint32_t* staged_routing;
  int routing_words;
  const uint64_t* token_counts;  // [W]
  const uint64_t* call_stamps;   // [W]: every rank's stamp, compared with this rank's
  int max_tokens;                // T
  int max_received;              // M: rows of the receive regions; rows past it are dropped
  int experts_per_rank;          // E
  uint64_t* dest_masks;          // scratch [W*T]: bit j = token goes to local rank j (R <= 64)
  // Outputs (handle tensors, see docs/semantics.md).
  int32_t* sparse_to_dense_map;    // [N*T, R]
  bool* rdma_to_attn_map;          // [ceil16(T), N]
  bool* attn_to_rdma_map;          // [T, N-1]
  int32_t* num_dispatched_tokens;  // [1]
  bool* local_expert_routing_map;  // [W*T, E], zero-filled beforehand
  int32_t* dense_chunk_layout;     // [W*C + 1]: first row of each (source, chunk), then D
  int32_t* dropped_rows;           // [1] or null: rows routed here past M, dropped
  int chunk;                       // dispatch tokens per chunk (C = ceil(T / chunk))
  PreprocessSummary* summary;      // host-mapped
};

// dispatch_with_permute with fuse_permute_dispatch: blocks of the dispatch grid past its
// dispatch blocks scatter every received chunk into the expert-major output as soon as the
// chunk's flag says it is here (one TMA load per row, one bulk store per selected expert), and
// write the zero rows (padding, tail) meanwhile. The outputs are those of the permute kernel.
struct FusedPermuteParams {
  const int32_t* chunk_layout;         // handle entry 5: [W*C + 1] first dispatch row per chunk
  const int32_t* dense_to_expert_map;  // [rows, E]: permuted row, or -1
  const int32_t* row_source;           // [P]: -1 where the output row is zero
  int num_permuted;                    // P
  int experts_per_rank;                // E
  int local_prob_offset;               // local_rank * E: this rank's columns of the E*R probs
  int slice;                           // rows per work item of a permute block (<= 32)
  uint8_t* out;                        // [P, row_bytes]
  float* out_probs;                    // [P] or null
  float* out_scales;                   // [P, scale_cols] or null
};

// Inside one domain, the caller's outputs that take a rank's rows from itself, in place of its
// own registered buffer (same row index): those rows skip the copy out of the buffer.
struct OwnDispatchRows {
  uint8_t* rows;  // null: every row goes through the registered buffers
  float* probs;
  float* scales;
};

// Forwarded tokens: with N domains the kernel forwards token i = n * T + t, token t of the peer
// in domain n (its own tokens for n = node_rank), to the ranks of this domain.
// The receive_targets region (uint64 words, offsets from the owner's registered base): where
// this call's dispatch rows, probs and scales land and how many rows fit there; where its
// combine input rows and probs are.
struct ReceiveTargets {
  static constexpr int kDispatchRows = 0, kDispatchProbs = 1, kDispatchScales = 2,
                       kDispatchCapacity = 3, kCombineRows = 4, kCombineProbs = 5;
  static constexpr int kDispatchWords = 4, kCombineWords = 2;
};
struct ReceiveTargetWords {
  uint64_t at[4];
  int count;
};

struct DispatchParams {
  DomainView domain;
  TransportContext transport;          // the network leg (domain.nodes > 1)
  const uint8_t* hidden;               // [num_tokens, row_bytes]
  const float* probs;                  // [num_tokens, E_total] or null
  const float* scales;                 // [num_tokens, scale_cols] or null
  const int32_t* sparse_to_dense_map;  // handle entry 0: [N*T, R]
  const bool* attn_to_rdma_map;        // handle entry 2: [T, N-1] (several domains)
  const float* restriped_probs;        // [N, T, E*R] (several domains, with probs)
  const uint8_t* net_hidden;           // what the network leg sends: hidden, or its registered copy
  const float* net_scales_src;         // (Runtime::needs_registered_sources); the same for scales
  int num_tokens;
  int max_tokens;
  int row_bytes;
  int prob_cols;        // E*R: one domain's columns
  int prob_col_offset;  // node_rank * E*R
  int experts_total;
  int scale_cols;
  int chunk;                 // tokens per chunk
  int max_chunks;            // chunks per domain (every one is signalled each call)
  int channels;              // transport channels: block b sends on channel b % channels
  int stages;                // shared-memory ring depth
  bool side_by_tma;          // probs/scales 16-byte aligned: carried through the TMA ring
  bool prob_puts_per_token;  // the network leg puts probs per token (HYBRID_EP_PROB_PUTS)
  int dispatch_blocks;       // blocks that dispatch (chunk c is block c % dispatch_blocks's)
  int permute_blocks;        // blocks that permute (fused); 0 for a plain dispatch
  int first_permute_block;   // the permute blocks are blocks first_permute_block, ...
  FusedPermuteParams permute;
  OwnDispatchRows own;
  size_t dispatch_rows, dispatch_probs, dispatch_scales;  // region offsets
  DispatchFlags dispatch_flags;                           // at max_chunks
  size_t net_rows, net_probs, net_scales;                 // rings [N-1, ring_chunks, chunk, ...]
  ChunkFlags network_flags;
  // Several domains: the peers' rings hold ring_chunks chunks per other domain; chunk c goes
  // into slot c % ring_chunks once the receiver credited chunk c - ring_chunks back
  // (dispatch_credits, in this rank's buffer), and the receiver credits each chunk it consumed
  // on the control transport.
  int ring_chunks;
  ChunkFlags dispatch_credits;
  TransportContext control;
  bool withhold_credits;  // HYBRID_EP_FAULT (tests): never credit a chunk back
  // Inside one domain of several ranks: each rank's rows land where its receive_targets region
  // says (published by launch_publish_dispatch before its release), its registered regions or
  // the zero-copy pool; else (alone: own) the regions above.
  bool published_targets;
  size_t receive_targets;
  // HYBRID_EP_EAGER (several domains): the rows between domains travel in the eager form
  // (network_send_eager.cuh, dispatch_eager.cuh): chunk c of the k-th other domain in slot
  // k * ring_chunks + c % ring_chunks of net_rows, eager_slot_bytes each, its tiles' signals
  // from the epoch at eager_epoch (this rank's buffer, kernels/common/eager_epoch.cuh). Towards
  // a peer that is not mapped the slot is first written into the same slot of this rank's
  // eager_staging (eager_rows_staging), the source of TransportDevice::put_eager.
  bool eager;
  int64_t eager_slot_bytes;
  size_t eager_epoch;
  size_t eager_staging;
};

// Unpermute: dense row i < D (read on the device) is the fp32 sum, ascending expert, of the
// permuted rows dense_to_expert_map[i, e] >= 0; written into the registered combine region.
struct UnpermuteParams {
  const uint16_t* hidden;              // bf16 [P, H]
  const float* probs;                  // [P] or null
  const int32_t* dense_to_expert_map;  // [rows, E]
  const int32_t* num_dispatched;       // device [1]: D
  int hidden_size;                     // H
  int experts_per_rank;
  int prob_cols;        // E*R
  int prob_col_offset;  // local_rank * E
  float* dense;         // fp32 [D, H]
  float* dense_probs;   // [D, prob_cols] (only this rank's columns are written) or null
};

// combine_with_unpermute with fuse_unpermute_combine: blocks of the combine grid past its
// combine blocks unpermute this rank's dispatch rows one (source, chunk) at a time and signal
// each to the rank that pulls it (kernels/combine_unpermute.cuh); the loader waits for those
// flags instead of a domain barrier.
struct FusedUnpermuteParams {
  UnpermuteParams rows;         // what the standalone kernel gets
  const int32_t* chunk_layout;  // handle entry 5: [W*C + 1] first dispatch row per chunk
  int dispatch_chunk;           // tokens per chunk of chunk_layout
  int max_chunks;               // C
  int max_tokens;               // T: forwarded token i = n * T + t
  UnpermuteFlags flags;         // [R, N, C, slices]: its slices are the work items per unit
};

// The combine between domains (CombineParams::partial): each forwarded chunk's in-domain sum is
// one partial per token, rounded once to the wire's width, which network warps put to the
// token's source as soon as the chunk is reduced; the source adds the partials of every domain
// (ascending) into its BF16 output as they arrive. docs/multi-domain.md, "Combine".
struct CombineAcross {
  TransportContext transport;
  const bool* rdma_to_attn_map;  // handle entry 1: [ceil16(T), N]
  const bool* attn_to_rdma_map;  // handle entry 2: [T, N-1]
  int max_tokens;                // T: forwarded token i = n * T + t
  int max_chunks;                // chunks per domain (every one is signalled each call)
  int out_tokens;                // this rank's tokens (output rows)
  int channels;                  // block b sends on channel b % channels
  bool bf16_wire;                // partials are BF16 (HYBRID_EP_COMBINE_WIRE=bf16), else fp32
  uint8_t* partials;             // this rank's [N, T, H] partials (wire dtype), registered
  float* partial_probs;          // [N, T, E*R] or null
  size_t partials_at, partial_probs_at;  // their region offsets (the puts' sources)
  // Region offsets: partials [T + ring rows] (own tokens, then the ring of the puts' sources);
  // net_partials: ring [N-1, ring_chunks, chunk] of what the other domains put here.
  size_t net_partials, net_partial_probs;
  ChunkFlags combine_flags;  // at max_chunks
  // As for dispatch (DispatchParams::ring_chunks): a chunk's partials for domain n are written
  // once n credited chunk c - ring_chunks back; the final pass credits each chunk it consumed.
  int ring_chunks;
  ChunkFlags combine_credits;
  TransportContext control;
  bool withhold_credits;  // HYBRID_EP_FAULT (tests): never credit a chunk back
  // HYBRID_EP_EAGER: the partials go in the eager form (combine_eager.cuh): chunk c from the
  // k-th other domain in slot k * ring_chunks + c % ring_chunks of net_partials,
  // eager_slot_bytes each, a record of partial and probs per token that came; the tiles'
  // signals from the epoch at eager_epoch (this rank's buffer). No combine_flags. Towards a
  // peer that is not mapped the records go into the same slot of this rank's eager_staging
  // (eager_partials_staging) first, the source of TransportDevice::put_eager.
  bool eager;
  int64_t eager_slot_bytes;
  size_t eager_epoch;
  size_t eager_staging;
};

// With `partial` (several domains) the kernel reduces every forwarded token i < num_tokens
// (= N*T) into partials (`across`), and its network warps and final step produce `out`.
struct CombineParams {
  DomainView domain;
  const int32_t* sparse_to_dense_map;  // [num_tokens, R]
  int num_tokens;
  int hidden;
  int pieces;       // each row moves as this many equal column ranges (hidden / pieces % 8 == 0)
  bool fp32_input;  // the staged rows are fp32 (unpermuted sums), else BF16
  int prob_cols;    // E*R
  int experts_per_rank;
  int chunk;  // tokens per chunk (with several domains, the dispatch chunk of the flags)
  int stages;
  size_t combine_rows, combine_probs;  // region offsets in the peers
  uint16_t* out;                       // bf16 [tokens of this rank, H]
  float* out_probs;                    // [tokens of this rank, E_total] or null
  bool partial;
  CombineAcross across;       // used with `partial`
  int combine_blocks;         // blocks that combine (chunk c is block c % combine_blocks's)
  int unpermute_blocks;       // blocks that unpermute (fused); 0 otherwise
  int first_unpermute_block;  // the unpermute blocks are blocks first_unpermute_block, ...
  FusedUnpermuteParams unpermute;
  // Inside one domain, this rank's rows from its own tokens read from the caller's input (the
  // same row index) instead of its registered buffer, which then need not be staged.
  const uint8_t* own_rows;  // bf16 [D, H] or null
  const float* own_probs;   // [D, E*R] or null
  // Inside one domain: each rank's staged rows and probs are where its receive_targets region
  // says (its combine region, or a zero-copy pool block), published before the barrier.
  bool published_sources;
  size_t receive_targets;
};

// Permute: output row o of the expert-major layout gathers dispatch row i for expert e, where
// row_source[o] = i * E + e, or is zero (padding, or past the data) where it is -1.
struct PermuteParams {
  const uint8_t* rows;        // this rank's received rows (registered), [D, row_bytes]
  const float* probs;         // [D, prob_cols] or null
  const float* scales;        // [D, scale_cols] or null
  const int32_t* row_source;  // [num_permuted]
  int num_permuted;           // P
  int row_bytes;
  int prob_cols;        // E*R
  int prob_col_offset;  // local_rank * E: this rank's columns
  int experts_per_rank;
  int scale_cols;
  uint8_t* out;       // [P, row_bytes]
  float* out_probs;   // [P] or null
  float* out_scales;  // [P, scale_cols] or null
};

// The permuted layout (docs/semantics.md, dispatch_with_permute) from the local expert routing
// map, on the device: expert segments padded to pad_multiple, cut at num_permuted rows.
struct PermuteLayoutParams {
  const bool* local_expert_routing_map;  // [rows, E]; rows at or past D are all false
  int rows;                              // T*W
  int experts_per_rank;                  // E
  int pad_multiple;
  int num_permuted;                // P
  int32_t* dense_to_expert_map;    // [rows, E] out: permuted row, or -1
  int32_t* row_source;             // [P] out: dispatch row * E + expert, or -1 (padding, tail)
  int32_t* raw_tokens_per_expert;  // [E] out
  int64_t* tokens_per_expert;      // [E] out: padded lengths of what fits into P
  int32_t* overflow;               // [1] out: 1 when a selected row did not fit
};

// Transport self-test: every rank puts `bytes` of a pattern into the peer of every other domain
// (scratch slot 1 + its domain) and signals it; then checks the slots its peers wrote.
struct TransportCheckParams {
  DomainView domain;
  TransportContext transport;
  size_t scratch;            // region offset: slot 0 is this rank's source pattern
  ChunkFlags network_flags;  // chunk 0 of each domain is used
  int channel;
  size_t bytes;
  unsigned long long* mismatches;  // device: wrong bytes (a timed-out peer counts all)
  // device [2N] or null: the global timer when this rank put to domain n ([n]) and when it saw
  // domain n's signal ([N + n]); the network emulation's test compares them across ranks.
  unsigned long long* times;
};

// Network-leg check: this rank sends its rows to the peer of every other domain the way the
// dispatch network warp will (runs per chunk, one signal per chunk and domain), then waits for
// every chunk its peers send. Block b sends and waits for chunks b, b + blocks, ...
struct NetworkSendCheckParams {
  DomainView domain;
  TransportContext transport;
  const bool* goes;     // [num_tokens, N-1]: token t goes to the k-th other domain
  const uint8_t* rows;  // [num_tokens, row_bytes]
  int num_tokens;       // T: every chunk of it is signalled
  int chunk;
  int row_bytes;
  size_t net_rows;  // region offset of the rings [N-1, ring_chunks, chunk, row_bytes]
  int ring_chunks;  // every chunk of T has its own slot (no credits: run_network_send_check)
  ChunkFlags network_flags;
};

// Byte ranges copied by one kernel (kernels/segment_copy.cu). The dispatch's copy-out and the
// combine's staging move up to three tensors' rows on both sides of a skipped range: as
// separate memcpys those were up to six launches, the small ones ~10 us of GPU time each.
constexpr int kMaxCopySegments = 8;
struct CopySegment {
  const uint8_t* src;
  uint8_t* dst;
  size_t bytes;
};
struct SegmentCopyParams {
  CopySegment segments[kMaxCopySegments];
  int count;
};

// Shared-memory needs of the ring kernels, for the runtime's stage clamping.
int dispatch_min_stages();
size_t dispatch_reserved_smem(int chunk, int ranks);   // besides the ring: routes, run scratch
size_t dispatch_stage_bytes(const DispatchParams& p);  // p's rows, and its side data by TMA
bool dispatch_side_data_by_tma(const DispatchParams& p);
// Per stage for p's pieces, input type and probs; and the rest of the kernel's shared memory.
size_t combine_stage_bytes(const CombineParams& p);
size_t combine_reserved_smem(int chunk, int ranks, int nodes, bool eager);
// The combine kernel's chunk: the dispatch chunk with several domains (its flags and runs are
// per dispatch chunk), else the combine chunk.
int combine_chunk_of(int nodes, int dispatch_chunk, int combine_chunk);

// Launchers (kernels/*.cu). Each checks its launch and throws CudaError on failure.
void launch_domain_barrier(const BarrierParams& p, cudaStream_t stream);
// Inside one domain: waits until every peer has signalled as many combines as this rank has
// (combine_pulled): none still reads this rank's input of an earlier combine. Idempotent;
// times out like every wait.
void launch_wait_pulled(const DomainView& d, size_t combine_pulled, cudaStream_t stream);
// Inside one domain of several ranks, before a combine kernel: the wait above (`wait`), then
// `values` at `words` of this rank's receive_targets region (where the combine's input is),
// then the domain barrier, after which the peers read them.
void launch_combine_start(const BarrierParams& p, size_t combine_pulled, bool wait, uint64_t* words,
                          const ReceiveTargetWords& values, cudaStream_t stream);
// Inside one domain, after a combine kernel: this rank is done pulling from every peer's input
// (a count in each peer's combine_pulled, and its own slot counts its combines); then, with
// `wait`, the wait above: the peers are done with this rank's input.
void launch_combine_end(const DomainView& d, size_t combine_pulled, bool wait, cudaStream_t stream);
// Inside one domain, before a dispatch kernel: writes `values` at `targets` of this rank's own
// buffer, one more release at `releases` (its reads of the previous dispatch's rows are behind
// in stream order), then waits until every peer has released as often.
void launch_publish_dispatch(const DomainView& d, size_t targets, const ReceiveTargetWords& values,
                             size_t releases, cudaStream_t stream);
void launch_allgather(const AllgatherParams& p, cudaStream_t stream);
void launch_allgather_network(const AllgatherNetworkParams& p, cudaStream_t stream);
void launch_restripe(const RestripeParams& p, cudaStream_t stream);
// Up to 2 blocks per SM of `sms`.
void launch_segment_copy(const SegmentCopyParams& p, int sms, cudaStream_t stream);
void launch_metadata(const MetadataParams& p, int blocks, cudaStream_t stream);
// max(dispatch_blocks, first_permute_block + permute_blocks) blocks; with permute blocks, then
// the counter advance.
void launch_dispatch(const DispatchParams& p, cudaStream_t stream);
// max(combine_blocks, first_unpermute_block + unpermute_blocks) blocks; with unpermute blocks,
// then the counter advance.
void launch_combine(const CombineParams& p, cudaStream_t stream);
void launch_permute_layout(const PermuteLayoutParams& p, int blocks, cudaStream_t stream);
void launch_permute(const PermuteParams& p, int blocks, cudaStream_t stream);
void launch_unpermute(const UnpermuteParams& p, int blocks, cudaStream_t stream);
void launch_transport_check(const TransportCheckParams& p, cudaStream_t stream);
void launch_network_send_check(const NetworkSendCheckParams& p, int blocks, cudaStream_t stream);

}  // namespace hybrid_ep

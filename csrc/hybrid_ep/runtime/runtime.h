// The runtime of one HybridEPBuffer on one rank: its registered buffer (mapped by the whole
// NVLink domain), the consumer counters of its flags, scratch and the host-visible status.
// Framework-agnostic: raw device pointers and cudaStream_t in.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hybrid_ep/common/status.h"
#include "hybrid_ep/kernels/params.h"
#include "hybrid_ep/memory/layout.h"
#include "hybrid_ep/memory/pool_arena.h"
#include "hybrid_ep/memory/symmetric_buffer.h"
#include "hybrid_ep/transport/transport.h"

namespace hybrid_ep {

struct RuntimeConfig {
  int world = 1;
  int ranks = 1;  // per NVLink domain
  int nodes = 1;
  int node_rank = 0;
  int local_rank = 0;
  int experts_per_rank = 1;
  int max_tokens = 1;
  // Rows of the in-domain receive regions (max_num_of_tokens_for_experts); 0, or more than
  // world * max_tokens: world * max_tokens, the worst case.
  int64_t max_received = 0;
  // Bytes of the zero-copy pool inside the registered buffer; used with one domain only.
  int64_t zero_copy_pool_bytes = 0;
  int hidden = 16;  // widest hidden the buffer holds (BF16 rows)
  int dispatch_chunk = 64;
  int combine_chunk = 64;
  int stages_dispatch = 12;  // NUM_OF_STAGES_DISPATCH_API's default (config.py)
  int stages_combine = 16;   // NUM_OF_STAGES_G2S_COMBINE_API's default
  int sms_dispatch = 16;
  int sms_combine = 16;
  int sms_preprocessing = 32;
  double timeout_s = 30.0;
  int combine_pieces = 0;  // column pieces of a combine row; 0: automatic
  int channels = 1;        // transport channels per peer (HYBRID_EP_NUM_CHANNELS)
  bool fabric = false;     // cuMem fabric handles (multi-node NVLink)
  // HYBRID_EP_COMBINE_WIRE=fp32: the combine's partials between domains travel as fp32 (else
  // BF16, each domain's partial rounded once).
  bool combine_wire_fp32 = false;
  // HYBRID_EP_PROB_PUTS=token: the dispatch's network leg puts each token's probs on its own
  // (the form before the restripe coalesced them per run), to measure what coalescing saves.
  bool prob_puts_per_token = false;
  // HYBRID_EP_EAGER=1 (several domains, a build with the eager form): the dispatch's rows
  // between domains travel as tiles that carry their own signals (memory/eager_tiles.h).
  bool eager = false;
  // HYBRID_EP_NET_RING_CHUNKS: chunk slots per other domain of the rings between domains; 0: the
  // default (net_ring_chunks_for, memory/layout.h).
  int net_ring_chunks = 0;
  // HYBRID_EP_FAULT (tests only): this rank's kernels never credit the ring slots of dispatch /
  // combine back, so the other domains' senders time out at their credit wait.
  bool withhold_dispatch_credits = false;
  bool withhold_combine_credits = false;
  // HYBRID_EP_FAULT=stage_network_sources (tests only): treat this build's puts as reading only
  // registered memory, as doca's do, so that a p2p build runs the network sources' staging.
  bool stage_network_sources = false;
  // HYBRID_EP_FAULT=unmapped_peers (tests only, p2p build): the kernels see no peer of another
  // domain as mapped (transport option peers=unmapped), so they take the RDMA builds' path:
  // puts and signals from registered sources, the eager form through staged slots.
  bool unmapped_peers = false;
  // The transport backend's settings (TransportSetup::options), filled by the Python layer.
  std::map<std::string, std::string> transport_options;
};

// The buffer shape a Runtime of `config` lays its registered buffer out from.
BufferShape shape_of(const RuntimeConfig& config);

class Runtime {
 public:
  explicit Runtime(const RuntimeConfig& config);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Bytes of the registered buffer a runtime of `config` allocates (the transport may need to
  // know before the first runtime is built, e.g. to size a symmetric heap).
  static size_t registered_bytes(const RuntimeConfig& config);
  // Collective: every rank of the group calls it together, as the last call on this runtime.
  // Frees the transport and the registered buffer now, which a buffer whose free is itself
  // collective (an NVSHMEM heap) can only do on this path; dropping the runtime otherwise
  // leaks such a buffer instead of waiting for peers that may never come.
  void release();

  const RuntimeConfig& config() const { return config_; }
  const BufferShape& shape() const { return shape_; }
  const BufferLayout& layout() const { return layout_; }

  std::string export_handle() const { return buffer_->export_handle(); }
  void open_peers(const std::vector<std::string>& handles);
  bool connected() const { return connected_; }

  const DomainView& domain() const;
  // The stamp of the call about to launch (hybrid_ep/call_stamp.py): every launch after this
  // carries it, and the call's first exchange compares it with the peers'.
  void begin_call(uint64_t stamp) { domain_.stamp = stamp; }

  // The transport to the peers of the other domains (every build has one; with one domain it
  // connects to nothing). Bootstrap blobs travel through the caller's process group like the
  // buffer handles: connect_transport(blobs[n] = the peer of domain n).
  std::string transport_bootstrap() const { return transport_->bootstrap(); }
  void connect_transport(const std::vector<std::string>& blobs);
  const TransportContext& transport() const;
  // Whether network puts must read registered memory (dispatch then stages its rows there).
  bool needs_registered_sources() const;
  // The same transport with its own counters, for control traffic (barrier, routing
  // all-gather), so that transport_counters() shows the data path alone.
  const TransportContext& control_transport() const;
  // The barrier between operations (with the peers of the other domains when there are some).
  BarrierParams barrier() const;
  std::vector<ChannelCounters> transport_counters() const { return transport_->counters(); }
  void reset_transport_counters() { transport_->reset_counters(); }
  uint8_t* registered() const { return buffer_->local(); }
  // The zero-copy pool inside the registered buffer (null when it has none); blocks handed out
  // share its ownership of the buffer.
  const std::shared_ptr<PoolArena>& pool() const { return pool_; }
  // This process's address of every local rank's registered buffer (its own included).
  const std::vector<uint8_t*>& peer_bases() const { return buffer_->peers(); }
  uint64_t* dest_masks() const { return dest_masks_; }
  const PreprocessSummary& host_summary() const { return *host_summary_; }
  PreprocessSummary* device_summary() const { return device_summary_; }  // device address
  DeviceStatus status() const { return *status_; }
  // A handle's T (the buffer's tokens per rank when it was made), checked against this buffer,
  // which only grows; throws std::invalid_argument.
  int handle_tokens(int tokens) const;
  // SMs of the device, queried once (grids sized to the GPU).
  int sm_count() const { return sm_count_; }
  // Resource limits the kernels need (stages clamped to what shared memory holds).
  int dispatch_stages(size_t stage_bytes) const;
  int combine_stages(size_t stage_bytes) const;
  // Whether stages of `stage_bytes` leave room for every copy of a piece plus one prefetch.
  bool combine_fits(size_t stage_bytes) const;
  // Tokens per chunk of the combine kernel (combine_chunk_of).
  int combine_chunk() const {
    return combine_chunk_of(config_.nodes, config_.dispatch_chunk, config_.combine_chunk);
  }
  // Copies per token the combine's ring must hold at once: the domain's ranks, and with several
  // domains also the domains (the final pass pulls one partial from each).
  int combine_width() const {
    return config_.nodes > 1 ? std::max(config_.ranks, config_.nodes) : config_.ranks;
  }

 private:
  RuntimeConfig config_;
  BufferShape shape_;
  BufferLayout layout_;
  std::shared_ptr<SymmetricBuffer> buffer_;
  std::shared_ptr<PoolArena> pool_;
  std::unique_ptr<TransportHost> transport_;
  TransportContext transport_context_{};
  TransportContext control_context_{};
  ChannelCounters* control_counters_ = nullptr;
  bool transport_connected_ = false;
  uint64_t* expected_ = nullptr;               // consumer counters of the flag region
  uint64_t* dest_masks_ = nullptr;             // metadata scratch
  DeviceStatus* status_ = nullptr;             // host-mapped
  uint32_t* abort_ = nullptr;                  // device word set by a failed wait
  PreprocessSummary* host_summary_ = nullptr;  // host-mapped
  PreprocessSummary* device_summary_ = nullptr;
  DeviceStatus* device_status_ = nullptr;
  DomainView domain_{};
  int smem_limit_ = 0;
  int sm_count_ = 0;
  bool connected_ = false;
};

}  // namespace hybrid_ep

// nixl transport, host side. The NIXL control plane runs in Python (hybrid_ep/nixl_control.py):
// one agent per rank registers this rank's buffer, exchanges metadata with the peers of the
// other domains and prepares UCX memory views of their buffers and of ours. This class only
// carries those views to the GPU: bootstrap() describes the registered buffer for the control
// plane, and connect() takes, per domain, the device address of a view (the peer's remote view,
// our own local view for our domain), checks each view's header and builds the device context.
// Every put reads from the registered buffer (the views name only it), hence kRegisteredSources.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hybrid_ep/memory/symmetric_buffer.h"
#include "hybrid_ep/transport/counters.h"

// UCX's GPU-resident memory views (ucp/api/device/ucp_device_types.h); opaque to host code
// that includes this header, so that it needs no UCX include path.
struct ucp_device_local_mem_list;
struct ucp_device_remote_mem_list;

namespace hybrid_ep {

struct TransportSetup;

// Bits of TransportContext::fault, reported by TransportHost::counters().
enum NixlFault : unsigned int {
  kNixlFaultSourceOutside = 1,  // a put's source was not in the registered buffer
  kNixlFaultPost = 2,           // ucp_device_put or ucp_device_counter_inc returned an error
  kNixlFaultCompletion = 4,     // a flush saw an error, or no completion within HYBRID_EP_TIMEOUT_S
};

// What a warp still has to complete: the request of its last put that UCX left in progress
// (UCX completes a channel's operations in order, so the last one covers the earlier ones).
struct NixlPending {
  unsigned char request[64];  // ucp_device_request_t; the device header checks that it fits
  int channel;
  int in_flight;  // 1 while `request` has not completed
  int reserved[14];
};

struct TransportContext {
  const ucp_device_local_mem_list* local_view;            // our registered buffer, element 0
  const ucp_device_remote_mem_list* const* remote_views;  // device array [nodes]; ours null
  // device array [nodes]: the peer's registered buffer where UCX maps it into this process
  // (ucp_device_get_ptr: a cuda_ipc lane), else null; puts to a mapped peer are our warp's
  // stores. All null with HYBRID_EP_NIXL_DIRECT=0.
  uint8_t* const* mapped;
  const uint8_t* local_base;  // the registered buffer: every put's source must lie in it
  uint64_t local_bytes;
  NixlPending* pending;  // device array [pending_slots]: one per warp of a launch
  int pending_slots;
  ChannelCounters* counters;  // device array [channels]
  unsigned int* fault;        // device word of NixlFault bits
  int nodes;
  int node_rank;
  int channels;
  uint64_t flush_timeout_ns;  // HYBRID_EP_TIMEOUT_S: a flush reports a fault after it
};

class TransportHost {
 public:
  static constexpr bool kRegisteredSources = true;  // the views only name the registered buffer

  explicit TransportHost(const TransportSetup& setup);
  ~TransportHost();
  TransportHost(const TransportHost&) = delete;
  TransportHost& operator=(const TransportHost&) = delete;

  // The NIXL runtime is driven from Python; nothing is loaded here.
  static std::string preflight();

  // "address bytes device" of the registered buffer (decimal), what the control plane
  // registers with its NIXL agent.
  std::string bootstrap() const;
  // blobs[n]: the device address of the UCX memory view for domain n, 8 bytes little-endian:
  // the remote view of the peer's registered buffer, or for n == node_rank the local view of
  // ours. With one domain the blob is ignored. The views stay owned by the control plane,
  // which releases them after this object is gone.
  void connect(const std::vector<std::string>& blobs);
  TransportContext context() const;
  // After connect: false when every other domain's peer is mapped into this process (all puts
  // are then our stores, which read any device memory), so dispatch need not stage its rows.
  bool needs_registered_sources() const { return needs_registered_; }
  std::vector<ChannelCounters> counters() const;
  void reset_counters();

 private:
  const SymmetricBuffer* registered_;
  int nodes_, node_rank_, channels_;
  uint64_t timeout_ns_;
  ChannelCounters* counters_ = nullptr;
  unsigned int* fault_ = nullptr;
  NixlPending* pending_ = nullptr;
  int pending_slots_ = 0;
  const ucp_device_local_mem_list* local_view_ = nullptr;
  const ucp_device_remote_mem_list** remote_views_ = nullptr;  // device
  uint8_t** mapped_ = nullptr;                                 // device
  bool direct_ = true;  // options["nixl_direct"]: use the peers UCX maps into this process
  bool connected_ = false;
  bool needs_registered_ = true;
};

}  // namespace hybrid_ep

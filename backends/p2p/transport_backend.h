// p2p transport, host side: the peers of the other domains are reached through CUDA IPC (or
// fabric) mappings of their registered buffers, the same kind of mapping as inside a domain.
// Channels need no resources here; they only separate the counters.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hybrid_ep/memory/symmetric_buffer.h"
#include "hybrid_ep/transport/counters.h"
#include "wire_model.h"

namespace hybrid_ep {

struct TransportSetup;

struct TransportContext {
  uint8_t* const* node_bases;  // device array [nodes]: the peer's registered base per domain
  ChannelCounters* counters;   // device array [channels]
  int nodes;
  int node_rank;
  int channels;
  WireModel wire;  // HYBRID_EP_P2P_WIRE's emulated NIC; disabled by default
  // Option peers=unmapped (HYBRID_EP_FAULT=unmapped_peers, tests): mapped() answers null, so
  // the kernels take the path they take towards an RDMA peer (puts, staged eager slots).
  bool unmapped;
};

class TransportHost {
 public:
  static constexpr bool kRegisteredSources = false;  // stores read any device memory

  explicit TransportHost(const TransportSetup& setup);
  ~TransportHost();
  static std::string preflight() { return "p2p: CUDA IPC, nothing to load"; }
  TransportHost(const TransportHost&) = delete;
  TransportHost& operator=(const TransportHost&) = delete;

  std::string bootstrap() const;
  void connect(const std::vector<std::string>& blobs);
  TransportContext context() const;
  std::vector<ChannelCounters> counters() const;
  void reset_counters();

 private:
  void disconnect() noexcept;

  const SymmetricBuffer* registered_;
  int nodes_, node_rank_, channels_;
  std::vector<PeerMapping> mappings_;  // [nodes]; our own domain's entry stays empty
  uint8_t** node_bases_ = nullptr;     // device
  ChannelCounters* counters_ = nullptr;
  WireModel wire_;
  bool unmapped_ = false;
  bool connected_ = false;
};

}  // namespace hybrid_ep

// doca transport, host side: DOCA GPUNetIO queue pairs between this rank and its peer in every
// other domain, one per (channel, peer); channel c runs over NIC c % (NICs of this GPU), so
// several NICs per GPU are separate channels. The GPU posts RDMA writes and fetch-adds on them
// itself (transport_backend.cuh). DOCA's host library, libibverbs and libmlx5 are loaded at run
// time (doca_library.h): with a single domain nothing is loaded at all.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hybrid_ep/memory/symmetric_buffer.h"
#include "hybrid_ep/transport/counters.h"

struct doca_gpu_dev_verbs_qp;  // DOCA's device QP (common/doca_gpunetio_verbs_dev.h)

namespace hybrid_ep {

struct TransportSetup;

namespace doca {
class Network;
}

// Where a put or signal of (channel, node) goes. Keys are stored byte-swapped, as DOCA's WQE
// builders take them (DOCA_GPUNETIO_VERBS_MKEY_SWAPPED).
struct DocaRoute {
  doca_gpu_dev_verbs_qp* qp;  // null for our own domain
  uint64_t remote_base;       // the peer's registered buffer, as it registered it
  uint32_t rkey_be;           // the peer's key of that buffer on its NIC of this channel
  uint32_t lkey_be;           // our key of our registered buffer on our NIC of this channel
  uint32_t sink_lkey_be;      // our key of the signal sink on that NIC
  uint32_t reserved;
};

// A warp's puts not yet turned into work requests: they become WQEs together, one per lane, at
// the warp's next signal or flush (or when the batch is full, or the target changes).
struct DocaPendingPut {
  uint64_t remote_offset;
  uint64_t local_offset;
  uint64_t bytes;
};
constexpr int kDocaBatchCapacity = 32;
struct DocaBatch {
  int count;
  int channel;
  int node;
  int reserved;
  DocaPendingPut puts[kDocaBatchCapacity];
};

// Bits of TransportContext::fault, reported by TransportHost::counters().
enum DocaFault : unsigned int {
  kDocaFaultSourceOutside = 1,  // a put's source was not in the registered buffer
  kDocaFaultCompletion = 2,     // a completion came back with an error
  kDocaFaultFlushTimeout = 4,   // a flush saw no completion within HYBRID_EP_TIMEOUT_S
};

struct TransportContext {
  const DocaRoute* routes;    // device array [channels][nodes]
  const uint8_t* local_base;  // the registered buffer: every put's source must lie in it
  uint64_t local_bytes;
  uint64_t* sink;      // registered scratch the fetch-adds return old values into
  DocaBatch* batches;  // device array [batch_slots]: one per warp of a launch
  int batch_slots;
  ChannelCounters* counters;  // device array [channels]
  unsigned int* fault;        // device word of DocaFault bits
  int nodes;
  int node_rank;
  int channels;
  uint64_t flush_timeout_ns;  // HYBRID_EP_TIMEOUT_S: a flush reports a fault after it
};

class TransportHost {
 public:
  static constexpr bool kRegisteredSources = true;  // the NIC reads with our buffer's key

  explicit TransportHost(const TransportSetup& setup);
  ~TransportHost();
  TransportHost(const TransportHost&) = delete;
  TransportHost& operator=(const TransportHost&) = delete;

  // Loads the host libraries without touching the GPU; returns what was loaded, throws
  // TransportUnavailable naming what is missing.
  static std::string preflight();

  std::string bootstrap() const;
  void connect(const std::vector<std::string>& blobs);
  TransportContext context() const;
  std::vector<ChannelCounters> counters() const;
  void reset_counters();

 private:
  const SymmetricBuffer* registered_;
  int nodes_, node_rank_, channels_;
  uint64_t timeout_ns_;
  ChannelCounters* counters_ = nullptr;
  unsigned int* fault_ = nullptr;
  DocaBatch* batches_ = nullptr;
  int batch_slots_ = 0;
  uint64_t* sink_ = nullptr;
  DocaRoute* routes_ = nullptr;             // device
  std::unique_ptr<doca::Network> network_;  // null with one domain
  bool connected_ = false;
};

}  // namespace hybrid_ep

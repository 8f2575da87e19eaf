// The transport contract, host side (docs/architecture.md). Traffic between NVLink domains goes
// through it; exactly one backend per build (backends/<name>, chosen by HYBRID_EP_TRANSPORT)
// supplies, from its header `transport_backend.h`:
//
//   struct TransportContext     POD passed by value in kernel parameters (the device side
//                               reads it, see transport_device.cuh); holds the per-channel
//                               counters' device address in a field `ChannelCounters*
//                               counters` (the runtime points a copy of the context at other
//                               counters for control traffic).
//   class TransportHost
//     static constexpr bool kRegisteredSources   true when a put's source must lie in this
//                                                 rank's registered buffer (RDMA: the NIC
//                                                 needs its key); the runtime then stages the
//                                                 caller's rows there before they are sent
//     static std::string preflight()              checks, without touching the GPU, what the
//                                                  backend loads at run time; throws
//                                                  TransportUnavailable (transport_error.h)
//     TransportHost(const TransportSetup&)        allocates what the backend needs locally
//     std::string bootstrap() const               bytes the peers of other domains need
//     void connect(const std::vector<std::string>& blobs)
//                                                  blobs[n]: bootstrap() of this rank's peer
//                                                  in domain n (n = node_rank is our own)
//     TransportContext context() const            valid after connect()
//     std::vector<ChannelCounters> counters() const   a synchronous read
//     void reset_counters()
//
// and may supply (transport_hooks.h gives the default to backends that do not):
//
//     static std::unique_ptr<SymmetricBuffer> make_registered(const TransportSetup&, size_t,
//                                                             HandleKind)
//                                                  allocates the registered buffer itself
//                                                  (setup.registered is still null), for a
//                                                  library whose remote writes must land in
//                                                  memory it allocated; default: an IPC or
//                                                  fabric SymmetricBuffer
//     bool needs_registered_sources() const       after connect(): whether puts must read
//                                                  registered memory after all (false when
//                                                  every peer is mapped and puts are our own
//                                                  stores); default: kRegisteredSources
//     static std::string unique_id()              bytes one rank makes and the whole group
//                                                  receives before building its runtimes
//                                                  (RuntimeConfig::transport_options); default:
//                                                  none
//     static std::string describe_failure(const std::string& call, int status, int stage)
//     static std::string version_mismatch(int built_major, int built_minor, int built_patch,
//                                         int loaded_major, int loaded_minor, int loaded_patch)
//                                                  the backend's error table and library
//                                                  version rule, bound as _C functions of the
//                                                  same names (prefixed transport_) so that CPU
//                                                  tests check them on fixed inputs
//
// The peer of domain n is the rank with this rank's local index in domain n. Channels are
// independent queues per peer (HYBRID_EP_NUM_CHANNELS); block b of a kernel uses channel
// b % channels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "hybrid_ep/memory/symmetric_buffer.h"
#include "hybrid_ep/transport/counters.h"
#include "hybrid_ep/transport/transport_error.h"

namespace hybrid_ep {

struct TransportSetup {
  const SymmetricBuffer* registered;  // this rank's registered buffer: what peers write into
  int nodes;                          // N domains
  int node_rank;                      // this rank's domain
  int channels;                       // >= 1
  // Backend settings resolved by the Python layer (hybrid_ep/transport_options.py), as strings;
  // a backend ignores the keys it does not know.
  std::map<std::string, std::string> options;
  int ranks = 1;       // ranks per domain: the peer of domain n is global rank n*ranks+local_rank
  int local_rank = 0;  // this rank's index in its domain
  // HYBRID_EP_TIMEOUT_S: the longest a device-side wait of the backend (a flush) may take.
  uint64_t timeout_ns = 30ull * 1000 * 1000 * 1000;

  // A "0"/"1" option of `backend` (fallback when absent); throws std::invalid_argument
  // naming the backend, the key and the value otherwise.
  bool flag_option(const std::string& backend, const std::string& key, bool fallback) const {
    const auto it = options.find(key);
    if (it == options.end()) return fallback;
    if (it->second != "0" && it->second != "1") {
      throw std::invalid_argument(backend + " transport: option " + key + "='" + it->second +
                                  "', expected 0 or 1");
    }
    return it->second == "1";
  }

  // Every backend's constructor starts here; throws std::invalid_argument.
  void check() const {
    if (nodes < 1 || node_rank < 0 || node_rank >= nodes || channels < 1 || ranks < 1 ||
        local_rank < 0 || local_rank >= ranks) {
      throw std::invalid_argument(
          "transport: need nodes >= 1, 0 <= node_rank < nodes, channels >= 1 and 0 <= "
          "local_rank < ranks (got " +
          std::to_string(nodes) + ", " + std::to_string(node_rank) + ", " +
          std::to_string(channels) + ", " + std::to_string(local_rank) + ", " +
          std::to_string(ranks) + ")");
    }
  }
};

}  // namespace hybrid_ep

#include "transport_backend.h"  // the backend's TransportContext and TransportHost

// The p2p build's emulated network (HYBRID_EP_P2P_WIRE, docs/multi-domain.md "Network
// emulation"): with no NIC on one host, puts to another domain still land at once, but a
// signal becomes visible only when a NIC of the given rate, per-operation cost and latency
// would have delivered it and every earlier put of its channel. Host side: the settings and
// the device words the model advances.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace hybrid_ep {

struct WireModel {
  bool enabled = false;
  uint64_t fs_per_byte = 0;  // femtoseconds per byte of one rail (1e6 / GB/s)
  uint64_t op_ns = 0;        // a rail's cost per operation (put or signal), before its bytes
  uint64_t latency_ns = 0;   // from leaving the rail to delivery
  // Added to a signal's delivery: a multi-path NIC fences an atomic after writes, waiting for
  // their completion and then one round trip (2 x latency_ns; 0 with atomic_rtt=0).
  uint64_t fence_ns = 0;
  int rails = 1;                            // rank's rails; channel c leaves through rail c % rails
  unsigned long long* rail_free = nullptr;  // device [rails]: global-timer ns each rail idles
};

// The settings from the transport options (wire_fs_per_byte, wire_op_ns, wire_latency_ns,
// wire_rails, wire_fence_ns; hybrid_ep/transport_options.py writes them); disabled when
// absent. Throws std::invalid_argument on a malformed value.
WireModel wire_model_from_options(const std::map<std::string, std::string>& options);

// Allocates and zeroes the model's device words (one per rail); frees them.
void allocate_wire_state(WireModel& wire);
void free_wire_state(WireModel& wire) noexcept;

}  // namespace hybrid_ep

// Device-side error reporting shared by host and device code: a waiting kernel that cannot make
// progress records what it waited for here (host-mapped memory, readable without a sync) and
// gives up instead of spinning forever.
#pragma once

#include <cstdint>

namespace hybrid_ep {

// kMismatch: a peer's call stamp (hybrid_ep/call_stamp.py) differs from this rank's.
enum class StatusCode : int32_t { kOk = 0, kTimeout = 1, kMismatch = 2 };

enum class WaitSite : int32_t {
  kBarrier = 1,
  kAllgather = 2,
  kDispatchChunk = 3,
  kNetworkFlag = 4,       // a dispatch chunk from the peer of another domain
  kNetworkCombine = 5,    // combine partials from the peer of another domain
  kNetworkBarrier = 6,    // the barrier's signal from the peer of another domain
  kNetworkAllgather = 7,  // the routing map from the peer of another domain
  kForward = 8,           // the other domains' maps forwarded by a local rank
  kUnpermuteChunk = 9,    // a chunk unpermuted by a local rank (fused combine_with_unpermute)
  kReceiveRelease = 10,   // a local rank not yet at this dispatch (targets, release)
  kGatheredStamps = 11,   // the stamps the routing all-gather brought (peer: a global rank)
  kDispatchCredit = 12,   // a ring slot of dispatch rows consumed by the peer of another domain
  kCombineCredit = 13,    // a ring slot of combine partials consumed by the peer of another domain
  kCombinePulled = 14,    // a local rank still reading this rank's input of the previous combine
};

struct DeviceStatus {
  int32_t code;       // StatusCode; the first failure wins
  int32_t site;       // WaitSite
  int32_t peer;       // local rank waited for (the domain, for network sites)
  int32_t slot;       // chunk or counter index
  uint64_t expected;  // value waited for (kMismatch: this rank's stamp)
  uint64_t seen;      // value observed at the timeout (kMismatch: the peer's stamp)
  uint64_t stamp;     // the stamp of the call whose kernel failed (hybrid_ep/call_stamp.py)
};

}  // namespace hybrid_ep

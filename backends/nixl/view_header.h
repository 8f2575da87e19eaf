// The header every UCX memory view starts with (ucp_device_{local,remote}_mem_list_t: 16-bit
// version, 16-bit lane count, 32-bit element count) and the start-up check of it: a runtime
// whose view layout differs from the headers we compiled against must fail at connect, not
// write to wrong addresses from the GPU.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace hybrid_ep::nixl {

struct ViewHeader {
  uint16_t version;
  uint16_t lanes;
  uint32_t elements;
};
static_assert(sizeof(ViewHeader) == 8, "UCX's view header is 8 bytes");

// Throws std::runtime_error naming `what` (e.g. "the remote view of domain 1") when the header
// is not `expected_version`, has no element (element 0 is the registered buffer), or is a
// remote view without a lane. A local view may have none: UCX picks the lane from the remote
// view, and a local view made before any endpoint carries no per-lane data.
inline void check_view_header(const ViewHeader& h, uint16_t expected_version,
                              const std::string& what, bool remote) {
  if (h.version != expected_version) {
    throw std::runtime_error(
        "nixl transport: " + what + " has layout version " + std::to_string(h.version) +
        ", this build was compiled for version " + std::to_string(expected_version) +
        " (UCX device headers and the NIXL runtime's UCX disagree; rebuild against the UCX "
        "headers matching the installed nixl-cu13, or set UCX_HOME)");
  }
  if (remote && h.lanes == 0) {
    throw std::runtime_error("nixl transport: " + what +
                             " has no lane (no UCX transport reaches that peer's memory)");
  }
  if (h.elements == 0) {
    throw std::runtime_error("nixl transport: " + what +
                             " has no element (the registered buffer was not in the view)");
  }
}

}  // namespace hybrid_ep::nixl

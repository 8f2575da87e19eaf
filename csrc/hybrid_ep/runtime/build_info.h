// How this binary was built; exposed as hybrid_ep._C.build_info() so that bug reports and
// benchmark tables can say exactly what ran.
#pragma once

#include <string>

namespace hybrid_ep {

struct BuildInfo {
  std::string transport;             // HYBRID_EP_TRANSPORT, e.g. "p2p"
  std::string cuda_architectures;    // CMAKE_CUDA_ARCHITECTURES, ',' separated, e.g. "90a"
  std::string cuda_toolkit_version;  // nvcc's version, e.g. "13.0.88"
  std::string version;               // package version
  std::string host_compiler;         // id, version and path of the C++ compiler
  // The library the transport was built against, e.g. "NVSHMEM 3.8.0 (<lib dir>)"; empty when
  // it uses none beyond the CUDA toolkit.
  std::string transport_library;
};

BuildInfo build_info();

}  // namespace hybrid_ep

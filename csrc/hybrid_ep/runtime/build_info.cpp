#include "hybrid_ep/runtime/build_info.h"

#include <cstddef>

// CMakeLists.txt defines these for this file only; a build that skipped them is broken.
#if !defined(HYBRID_EP_BUILD_TRANSPORT) || !defined(HYBRID_EP_BUILD_CUDA_ARCHITECTURES) || \
    !defined(HYBRID_EP_BUILD_CUDA_TOOLKIT_VERSION) || !defined(HYBRID_EP_BUILD_VERSION) || \
    !defined(HYBRID_EP_BUILD_HOST_COMPILER) || !defined(HYBRID_EP_BUILD_TRANSPORT_LIBRARY)
#error "build_info.cpp must be compiled with the HYBRID_EP_BUILD_* definitions from CMake"
#endif

namespace hybrid_ep {
namespace {

// Kept whole in the binary's read-only data, so that when the module cannot be loaded (its
// transport library is missing) hybrid_ep/native.py can still read from the file what it was
// built against. The prefix is what it searches for; `used` keeps the whole array even though
// only its tail is read here.
[[gnu::used]] const char kTransportLibrary[] =
    "hybrid-ep transport library: " HYBRID_EP_BUILD_TRANSPORT_LIBRARY;
constexpr size_t kTransportLibraryPrefix = sizeof("hybrid-ep transport library: ") - 1;

}  // namespace

BuildInfo build_info() {
  return BuildInfo{HYBRID_EP_BUILD_TRANSPORT,
                   HYBRID_EP_BUILD_CUDA_ARCHITECTURES,
                   HYBRID_EP_BUILD_CUDA_TOOLKIT_VERSION,
                   HYBRID_EP_BUILD_VERSION,
                   HYBRID_EP_BUILD_HOST_COMPILER,
                   kTransportLibrary + kTransportLibraryPrefix};
}

}  // namespace hybrid_ep

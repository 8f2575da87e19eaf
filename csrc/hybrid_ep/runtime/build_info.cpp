#include "hybrid_ep/runtime/build_info.h"

// CMakeLists.txt defines these for this file only; a build that skipped them is broken.
#if !defined(HYBRID_EP_BUILD_TRANSPORT) || !defined(HYBRID_EP_BUILD_CUDA_ARCHITECTURES) || \
    !defined(HYBRID_EP_BUILD_CUDA_TOOLKIT_VERSION) || !defined(HYBRID_EP_BUILD_VERSION) || \
    !defined(HYBRID_EP_BUILD_HOST_COMPILER)
#error "build_info.cpp must be compiled with the HYBRID_EP_BUILD_* definitions from CMake"
#endif

namespace hybrid_ep {

BuildInfo build_info() {
  return BuildInfo{HYBRID_EP_BUILD_TRANSPORT, HYBRID_EP_BUILD_CUDA_ARCHITECTURES,
                   HYBRID_EP_BUILD_CUDA_TOOLKIT_VERSION, HYBRID_EP_BUILD_VERSION,
                   HYBRID_EP_BUILD_HOST_COMPILER};
}

}  // namespace hybrid_ep

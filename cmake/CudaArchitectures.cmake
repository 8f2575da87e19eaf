# CUDA architectures. Include before project(): enable_language(CUDA) fills in nvcc's own
# default (sm_75 for CUDA 13) when nothing is set, while the kernels target Hopper (TMA bulk
# copies, mbarrier transactions, arch-specific sm_90a instructions), hence 90a.
#
# Precedence: -DCMAKE_CUDA_ARCHITECTURES=... > the CUDAARCHS environment variable (read by
# CMake itself on the first configure of a build dir) > the default below.

set(HYBRID_EP_DEFAULT_CUDA_ARCHITECTURES "90a")

if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
  set(CMAKE_CUDA_ARCHITECTURES "${HYBRID_EP_DEFAULT_CUDA_ARCHITECTURES}"
      CACHE STRING "CUDA architectures to build for (e.g. 90a, \"90a;100a\")")
endif()

# The configured list as one string without ';' (so it can travel in a compile definition).
function(hybrid_ep_cuda_architectures_string out_var)
  string(REPLACE ";" "," archs "${CMAKE_CUDA_ARCHITECTURES}")
  set(${out_var} "${archs}" PARENT_SCOPE)
endfunction()

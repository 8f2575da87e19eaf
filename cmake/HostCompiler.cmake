# Host C++ compiler choice. Include before project().
#
# Why: a GPU image we build on exports CC/CXX pointing at a private GCC (/opt/gcc/bin). An
# extension built with it carried its own static copy of libstdc++ and crashed at import next
# to torch (two C++ runtimes in one process); a dynamically linked one could also need a newer
# GLIBCXX than the system libstdc++.so.6 that torch loads. So, unless the user names a compiler
# explicitly (-DCMAKE_CXX_COMPILER=..., or a toolchain file), prefer the system /usr/bin/g++
# over $CXX, and let nvcc use the same compiler for the host side of .cu files.
# The post-build check (cmake/CheckLinkage.cmake) still verifies NEEDED libstdc++.so.6.

if(NOT DEFINED CMAKE_CXX_COMPILER AND NOT DEFINED CMAKE_TOOLCHAIN_FILE
   AND EXISTS "/usr/bin/g++")
  # (scikit-build-core itself exports CXX=g++ from Python's sysconfig: nothing to report.)
  if(DEFINED ENV{CXX} AND NOT "$ENV{CXX}" MATCHES "^(/usr/bin/)?g\\+\\+$")
    message(STATUS "hybrid-ep: using /usr/bin/g++, not CXX=$ENV{CXX} "
                   "(pass -DCMAKE_CXX_COMPILER=... to override)")
  endif()
  set(CMAKE_CXX_COMPILER "/usr/bin/g++" CACHE FILEPATH "C++ compiler")
endif()

# nvcc otherwise compiles the host side of .cu files with $CUDAHOSTCXX or whatever g++ comes
# first on PATH; mixing two compilers' objects pulled the private GCC's runtime into the link
# on the GPU image (its CUDAHOSTCXX points there). Only -DCMAKE_CUDA_HOST_COMPILER overrides.
if(NOT DEFINED CMAKE_CUDA_HOST_COMPILER AND DEFINED CMAKE_CXX_COMPILER)
  if(DEFINED ENV{CUDAHOSTCXX} AND NOT "$ENV{CUDAHOSTCXX}" STREQUAL "${CMAKE_CXX_COMPILER}")
    message(STATUS "hybrid-ep: nvcc host compiler ${CMAKE_CXX_COMPILER}, not "
                   "CUDAHOSTCXX=$ENV{CUDAHOSTCXX} (pass -DCMAKE_CUDA_HOST_COMPILER=... to override)")
  endif()
  set(CMAKE_CUDA_HOST_COMPILER "${CMAKE_CXX_COMPILER}" CACHE FILEPATH "CUDA host compiler")
endif()
# CMake 4.4 takes the host compiler of its CUDA detection from $CUDAHOSTCXX even over the
# cache entry, and that compiler's library directories then reach the module's link (a static
# libstdc++ on the GPU image). So the detection sees the chosen compiler.
if(DEFINED CMAKE_CUDA_HOST_COMPILER)
  set(ENV{CUDAHOSTCXX} "${CMAKE_CUDA_HOST_COMPILER}")
endif()

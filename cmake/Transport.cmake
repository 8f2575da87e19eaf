# Transport backend selection (one per build). Include after project() and
# find_package(CUDAToolkit).
#
# A transport is implemented when backends/<name>/backend.cmake exists; nothing else in the
# build names a backend. That file sets:
#   HYBRID_EP_BACKEND_NAME                 must equal <name>
#   HYBRID_EP_BACKEND_SOURCES              host/device sources added to the core library
#   HYBRID_EP_BACKEND_INCLUDE_DIRS         include dirs (the backend's device header lives there)
#   HYBRID_EP_BACKEND_LINK_LIBRARIES       libraries the core links privately
#   HYBRID_EP_BACKEND_COMPILE_DEFINITIONS  definitions for the core's sources
#   HYBRID_EP_BACKEND_CUDA_RDC             ON if device code must be relocatable (-rdc=true)
# and may set (empty when unset):
#   HYBRID_EP_BACKEND_MODULE_LINK_LIBRARIES  shared libraries only the module _C links (never
#                                            the core: they stay off the device-link line)
#   HYBRID_EP_BACKEND_BUILD_RPATH          _C's run path in the build tree
#   HYBRID_EP_BACKEND_INSTALL_RPATH        _C's run path once installed (e.g. $ORIGIN/...)
#   HYBRID_EP_BACKEND_LIBRARY              the library the backend was built against, as
#                                          build_info()["transport_library"] reports it

set(HYBRID_EP_TRANSPORT "p2p" CACHE STRING "Transport backend (see backends/)")

file(GLOB _hybrid_ep_backend_files RELATIVE "${PROJECT_SOURCE_DIR}/backends"
     "${PROJECT_SOURCE_DIR}/backends/*/backend.cmake")
set(HYBRID_EP_IMPLEMENTED_TRANSPORTS "")
foreach(_file IN LISTS _hybrid_ep_backend_files)
  get_filename_component(_name "${_file}" DIRECTORY)
  list(APPEND HYBRID_EP_IMPLEMENTED_TRANSPORTS "${_name}")
endforeach()
list(SORT HYBRID_EP_IMPLEMENTED_TRANSPORTS)
set_property(CACHE HYBRID_EP_TRANSPORT PROPERTY STRINGS ${HYBRID_EP_IMPLEMENTED_TRANSPORTS})

list(JOIN HYBRID_EP_IMPLEMENTED_TRANSPORTS ", " _valid)
if(NOT HYBRID_EP_TRANSPORT IN_LIST HYBRID_EP_IMPLEMENTED_TRANSPORTS)
  message(FATAL_ERROR
    "HYBRID_EP_TRANSPORT=${HYBRID_EP_TRANSPORT} is not a known transport. "
    "Valid values: ${_valid}.")
endif()

foreach(_var NAME SOURCES INCLUDE_DIRS LINK_LIBRARIES COMPILE_DEFINITIONS CUDA_RDC
             MODULE_LINK_LIBRARIES BUILD_RPATH INSTALL_RPATH LIBRARY)
  unset(HYBRID_EP_BACKEND_${_var})
endforeach()
include("${PROJECT_SOURCE_DIR}/backends/${HYBRID_EP_TRANSPORT}/backend.cmake")
if(NOT HYBRID_EP_BACKEND_NAME STREQUAL HYBRID_EP_TRANSPORT)
  message(FATAL_ERROR "backends/${HYBRID_EP_TRANSPORT}/backend.cmake must set "
                      "HYBRID_EP_BACKEND_NAME to '${HYBRID_EP_TRANSPORT}'.")
endif()
message(STATUS "hybrid-ep: transport = ${HYBRID_EP_TRANSPORT}")

// NVSHMEM's status codes and init stages turned into messages that name the failed call, what
// the code means, how far initialisation got and what to check next. NVSHMEM itself maps most
// failures to 7 (internal), so the stage reached (nvshmemx_init_status) carries the hint.
#pragma once

#include <string>

namespace hybrid_ep::nvshmem {

// NVSHMEMX_SUCCESS .. NVSHMEMX_ERROR_INTERNAL (0-7); "unknown status" otherwise.
const char* status_name(int status);
// nvshmemx_init_status(): 0 not initialised .. 4 full MPG; "unknown stage" otherwise.
const char* init_status_name(int init_status);
// "nvshmem transport: <call> failed with status <n> (<name>) after NVSHMEM reached <stage>;
// <hints>". Reads the NVSHMEM_* variables it names, to show their current values.
std::string describe_failure(const std::string& call, int status, int init_status);

// NVSHMEM's rule for a device library built against `built` running on host library `loaded`:
// same major, built minor <= loaded minor. Empty when compatible, else why not.
std::string version_mismatch(int built_major, int built_minor, int built_patch, int loaded_major,
                             int loaded_minor, int loaded_patch);

}  // namespace hybrid_ep::nvshmem

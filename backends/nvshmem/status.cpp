#include "status.h"

#include <cstdlib>
#include <string>

namespace hybrid_ep::nvshmem {
namespace {

std::string variable(const char* name) {
  const char* value = std::getenv(name);
  return std::string(name) + "=" + (value != nullptr ? value : "<unset>");
}

std::string version(int major, int minor, int patch) {
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

// What to check, by how far initialisation got before the failure.
std::string hints(int init_status) {
  if (init_status <= 0) {
    // The unique-id bootstrap connects every PE to rank 0's socket before anything else.
    return "the bootstrap did not complete: every rank connects to rank 0's address from the "
           "unique id, on the interface " +
           variable("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME") +
           " (it must exist on every host and reach rank 0's; on one host use lo), and the "
           "ranks must agree on the world size and hold the same unique id";
  }
  if (init_status == 1) {
    // Bootstrapped: the failure is in the device, heap or transport set-up that follows.
    return "the bootstrap worked, the device set-up after it did not: a CUDA device must be "
           "current; check " +
           variable("NVSHMEM_REMOTE_TRANSPORT") + " (none: one host, P2P only), " +
           variable("NVSHMEM_IB_ENABLE_IBGDA") + ", the CUDA VMM heap (" +
           variable("NVSHMEM_DISABLE_CUDA_VMM") + "; 1 uses a static heap of " +
           variable("NVSHMEM_SYMMETRIC_SIZE") + ") and, with several processes per GPU, MPS";
  }
  return "NVSHMEM is initialised: check the symmetric heap (" + variable("NVSHMEM_SYMMETRIC_SIZE") +
         ", " + variable("NVSHMEM_DISABLE_CUDA_VMM") + ") and that every rank makes the same calls";
}

}  // namespace

const char* status_name(int status) {
  switch (status) {
    case 0:
      return "NVSHMEMX_SUCCESS";
    case 1:
      return "NVSHMEMX_ERROR_INVALID_VALUE";
    case 2:
      return "NVSHMEMX_ERROR_OUT_OF_MEMORY";
    case 3:
      return "NVSHMEMX_ERROR_NOT_SUPPORTED";
    case 4:
      return "NVSHMEMX_ERROR_SYMMETRY";
    case 5:
      return "NVSHMEMX_ERROR_GPU_NOT_SELECTED";
    case 6:
      return "NVSHMEMX_ERROR_COLLECTIVE_LAUNCH_FAILED";
    case 7:
      return "NVSHMEMX_ERROR_INTERNAL";
    default:
      return "unknown status";
  }
}

const char* init_status_name(int init_status) {
  switch (init_status) {
    case 0:
      return "not initialised";
    case 1:
      return "bootstrapped";
    case 2:
      return "initialised";
    case 3:
      return "initialised, limited multiple PEs per GPU";
    case 4:
      return "initialised, full multiple PEs per GPU";
    default:
      return "unknown stage";
  }
}

std::string describe_failure(const std::string& call, int status, int init_status) {
  return "nvshmem transport: " + call + " failed with status " + std::to_string(status) + " (" +
         status_name(status) + ") after NVSHMEM reached stage " + std::to_string(init_status) +
         " (" + init_status_name(init_status) + "); " + hints(init_status) +
         ". Rerun with NVSHMEM_DEBUG=INFO for NVSHMEM's own log.";
}

std::string version_mismatch(int built_major, int built_minor, int built_patch, int loaded_major,
                             int loaded_minor, int loaded_patch) {
  if (built_major == loaded_major && built_minor <= loaded_minor) return std::string();
  return "this build's NVSHMEM device code is " + version(built_major, built_minor, built_patch) +
         " but the loaded libnvshmem_host.so.3 is " +
         version(loaded_major, loaded_minor, loaded_patch) +
         "; NVSHMEM needs the same major and a " +
         "host library at least as new (install nvidia-nvshmem-cu13 " +
         std::to_string(built_major) + ".x >= " + std::to_string(built_major) + "." +
         std::to_string(built_minor) + ", or rebuild hybrid-ep against the installed one)";
}

}  // namespace hybrid_ep::nvshmem

// What the process can see of CUDA. Safe to call on machines with no driver or no GPU
// (CI, login nodes): the import and the CPU test suite must work there.
#pragma once

namespace hybrid_ep {

// Number of visible CUDA devices; 0 when there is no driver or no device. Never throws.
int device_count() noexcept;

// Version of the CUDA runtime linked into the module (e.g. 13000 for 13.0).
int runtime_version();

// Latest CUDA version the installed driver supports; 0 when there is no driver.
int driver_version() noexcept;

// Opt-in shared memory per block of the current device (what a ring kernel may use).
int max_shared_memory_per_block();

// SMs of the current device (under an MPS thread percentage, the share it reports).
int multiprocessor_count();

}  // namespace hybrid_ep

#pragma once

#include <pybind11/pybind11.h>

namespace hybrid_ep {

// Adds the benchmark's helpers (the TMA copy ceiling) to the module.
void register_bench(pybind11::module_& m);

}  // namespace hybrid_ep

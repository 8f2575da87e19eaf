#pragma once

#include <pybind11/pybind11.h>

namespace hybrid_ep {

// Adds RuntimeConfig and Runtime (the CUDA engine's entry points) to the module.
void register_runtime(pybind11::module_& m);

}  // namespace hybrid_ep

#pragma once

#include <pybind11/pybind11.h>

namespace hybrid_ep {

// Adds buffer_layout (the registered buffer's regions for a config, no GPU needed).
void register_layout(pybind11::module_& m);

}  // namespace hybrid_ep

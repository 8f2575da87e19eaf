#pragma once

#include <pybind11/pybind11.h>

namespace hybrid_ep {

// Adds eager_tiles / eager_signal_value: the eager form's tile layout
// (memory/eager_tiles.h) on the host, so that the CPU tests check the kernels' own
// functions.
void register_eager_tiles(pybind11::module_& m);

}  // namespace hybrid_ep

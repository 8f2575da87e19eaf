#pragma once

#include <pybind11/pybind11.h>

namespace hybrid_ep {

// Adds Runtime.pool_block / pool_outputs / pool_stats / pool_holds: zero-copy pool blocks as
// DLPack capsules that torch.from_dlpack turns into ordinary tensors (docs/zero-copy.md).
void register_pool_tensor(pybind11::module_& m, pybind11::class_<class Runtime>& runtime);

}  // namespace hybrid_ep

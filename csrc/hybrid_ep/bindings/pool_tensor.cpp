// A block of the zero-copy pool handed to torch as a DLPack capsule: a 1-D uint8 CUDA tensor
// whose deleter returns the block, so the tensor's storage (and every view of it) keeps the
// block, and the block keeps the registered buffer. The structs below are the DLPack ABI
// (dlpack.h, version 0.8: the legacy unversioned "dltensor" capsule torch.from_dlpack takes).
#include "hybrid_ep/bindings/pool_tensor.h"

#include <cstdint>
#include <memory>

#include "hybrid_ep/runtime/runtime.h"

namespace py = pybind11;

namespace hybrid_ep {
namespace {

struct DLDevice {
  int32_t device_type;  // kDLCUDA = 2
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // kDLUInt = 1
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // null: compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

constexpr int32_t kDLCUDA = 2;
constexpr uint8_t kDLUInt = 1;
constexpr const char* kCapsuleName = "dltensor";  // not consumed yet

// What the capsule owns: the block, the arena it goes back to, and the shape DLPack points at.
struct PoolBlock {
  DLManagedTensor managed{};
  std::shared_ptr<PoolArena> arena;
  uint8_t* block = nullptr;
  int64_t shape[1] = {0};
};

void return_block(DLManagedTensor* managed) {
  auto* owner = static_cast<PoolBlock*>(managed->manager_ctx);
  owner->arena->free(owner->block);
  delete owner;
}

// A capsule torch never consumed still owns its block.
void drop_capsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kCapsuleName)) return;  // consumed: torch owns it now
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
}

py::object pool_block(const Runtime& r, size_t bytes, int device) {
  const std::shared_ptr<PoolArena>& arena = r.pool();
  uint8_t* block = arena ? arena->allocate(bytes) : nullptr;
  if (block == nullptr) return py::none();
  auto* owner = new PoolBlock;
  owner->arena = arena;
  owner->block = block;
  owner->shape[0] = int64_t(bytes);
  DLTensor& t = owner->managed.dl_tensor;
  t.data = block;
  t.device = {kDLCUDA, device};
  t.ndim = 1;
  t.dtype = {kDLUInt, 8, 1};
  t.shape = owner->shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  owner->managed.manager_ctx = owner;
  owner->managed.deleter = return_block;
  return py::reinterpret_steal<py::object>(
      PyCapsule_New(&owner->managed, kCapsuleName, drop_capsule));
}

}  // namespace

void register_pool_tensor(py::module_&, py::class_<Runtime>& runtime) {
  runtime
      .def("pool_block", &pool_block, py::arg("bytes"), py::arg("device"),
           "A DLPack capsule of `bytes` of the zero-copy pool (torch.from_dlpack: a uint8 CUDA "
           "tensor whose storage returns the block when freed), or None when the pool has no "
           "free range that large (or no pool).")
      .def("pool_stats",
           [](const Runtime& r) {
             py::dict d;
             const PoolStats s = r.pool() ? r.pool()->stats() : PoolStats{};
             d["bytes"] = s.bytes;
             d["in_use"] = s.in_use;
             d["largest_free"] = s.largest_free;
             d["blocks"] = s.blocks;
             return d;
           })
      .def(
          "pool_holds",
          [](const Runtime& r, uintptr_t address, size_t bytes) {
            return r.pool() != nullptr &&
                   r.pool()->holds(reinterpret_cast<const void*>(address), bytes);
          },
          py::arg("address"), py::arg("bytes"),
          "Whether [address, address + bytes) lies in one live block of the zero-copy pool.");
}

}  // namespace hybrid_ep

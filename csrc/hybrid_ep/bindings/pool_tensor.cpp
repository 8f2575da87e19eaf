// Blocks of the zero-copy pool handed to torch as DLPack capsules: CUDA tensors whose deleter
// drops their share of the block, so a tensor's storage (and every view of it) keeps the block,
// and the block keeps the registered buffer. One block may back several tensors (a dispatch's
// rows, probs and scales): it returns to the pool once all of them are freed. The structs
// below are the DLPack ABI (dlpack.h, version 0.8: the legacy unversioned "dltensor" capsule
// torch.from_dlpack takes).
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
constexpr uint8_t kDLFloat = 2;
constexpr uint8_t kDLBfloat = 4;
constexpr const char* kCapsuleName = "dltensor";  // not consumed yet

// A block of the pool, back in the arena when the last tensor on it is freed.
struct BlockLease {
  std::shared_ptr<PoolArena> arena;
  uint8_t* block;
  ~BlockLease() { arena->free(block); }
};

// What one capsule owns: its share of the block, and the shape DLPack points at.
struct PoolView {
  DLManagedTensor managed{};
  std::shared_ptr<BlockLease> lease;
  int64_t shape[2] = {0, 0};
};

void release_view(DLManagedTensor* managed) { delete static_cast<PoolView*>(managed->manager_ctx); }

// A capsule torch never consumed still owns its share.
void drop_capsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kCapsuleName)) return;  // consumed: torch owns it now
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
}

// A compact row-major [rows, cols] (cols < 0: 1-D [rows]) tensor at `data` in the lease's block.
py::object view_capsule(const std::shared_ptr<BlockLease>& lease, uint8_t* data, int64_t rows,
                        int64_t cols, DLDataType dtype, int device) {
  auto* view = new PoolView;
  view->lease = lease;
  view->shape[0] = rows;
  view->shape[1] = cols;
  DLTensor& t = view->managed.dl_tensor;
  t.data = data;
  t.device = {kDLCUDA, device};
  t.ndim = cols < 0 ? 1 : 2;
  t.dtype = dtype;
  t.shape = view->shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  view->managed.manager_ctx = view;
  view->managed.deleter = release_view;
  return py::reinterpret_steal<py::object>(
      PyCapsule_New(&view->managed, kCapsuleName, drop_capsule));
}

std::shared_ptr<BlockLease> lease_block(const Runtime& r, size_t bytes) {
  const std::shared_ptr<PoolArena>& arena = r.pool();
  uint8_t* block = arena ? arena->allocate(bytes) : nullptr;
  if (block == nullptr) return nullptr;
  return std::shared_ptr<BlockLease>(new BlockLease{arena, block});
}

size_t aligned(size_t bytes) {
  return (bytes + PoolArena::kAlign - 1) / PoolArena::kAlign * PoolArena::kAlign;
}

py::object pool_block(const Runtime& r, size_t bytes, int device) {
  const std::shared_ptr<BlockLease> lease = lease_block(r, bytes);
  if (!lease) return py::none();
  return view_capsule(lease, lease->block, int64_t(bytes), -1, {kDLUInt, 8, 1}, device);
}

// A dispatch's outputs in one block: rows [rows, row_bytes] as uint8 (BF16 [rows, row_bytes /
// 2] with bf16_rows), probs [rows, prob_cols] and scales [rows, scale_cols] as float32 (none
// where 0 columns). Built here rather than as views of one block in Python: the views cost
// ~10 us of every call's host time.
py::object pool_outputs(const Runtime& r, int64_t rows, int64_t row_bytes, bool bf16_rows,
                        int64_t prob_cols, int64_t scale_cols, int device) {
  const size_t row_part = aligned(size_t(rows * row_bytes));
  const size_t prob_part = aligned(size_t(rows * prob_cols) * sizeof(float));
  const size_t scale_part = aligned(size_t(rows * scale_cols) * sizeof(float));
  const std::shared_ptr<BlockLease> lease = lease_block(r, row_part + prob_part + scale_part);
  if (!lease) return py::none();
  const DLDataType u8{kDLUInt, 8, 1}, bf16{kDLBfloat, 16, 1}, f32{kDLFloat, 32, 1};
  uint8_t* at = lease->block;
  py::object out = bf16_rows ? view_capsule(lease, at, rows, row_bytes / 2, bf16, device)
                             : view_capsule(lease, at, rows, row_bytes, u8, device);
  py::object probs =
      prob_cols > 0 ? view_capsule(lease, at + row_part, rows, prob_cols, f32, device) : py::none();
  py::object scales =
      scale_cols > 0 ? view_capsule(lease, at + row_part + prob_part, rows, scale_cols, f32, device)
                     : py::none();
  return py::make_tuple(out, probs, scales);
}

}  // namespace

void register_pool_tensor(py::module_&, py::class_<Runtime>& runtime) {
  runtime
      .def("pool_block", &pool_block, py::arg("bytes"), py::arg("device"),
           "A DLPack capsule of `bytes` of the zero-copy pool (torch.from_dlpack: a uint8 CUDA "
           "tensor whose storage returns the block when freed), or None when the pool has no "
           "free range that large (or no pool).")
      .def("pool_outputs", &pool_outputs, py::arg("rows"), py::arg("row_bytes"),
           py::arg("bf16_rows"), py::arg("prob_cols"), py::arg("scale_cols"), py::arg("device"),
           "A dispatch's outputs in one block of the zero-copy pool: capsules of uint8 rows "
           "[rows, row_bytes] (BF16 [rows, row_bytes / 2] with bf16_rows), float32 probs [rows, "
           "prob_cols] and scales [rows, scale_cols] "
           "(None for 0 columns); the block returns once all three tensors are freed. None when "
           "the pool has no room.")
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

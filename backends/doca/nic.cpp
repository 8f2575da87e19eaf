#include "nic.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace hybrid_ep::doca {
namespace {

// No IBV_ACCESS_RELAXED_ORDERING: the eager form (put_eager) relies on a write's bytes landing
// in order, each tile's signal after its data.
constexpr int kAccess = ibv::kAccessLocalWrite | ibv::kAccessRemoteWrite | ibv::kAccessRemoteRead |
                        ibv::kAccessRemoteAtomic;

// GPU memory is mapped to the NIC in 64 KiB pages; cudaMalloc'd allocations start on such a
// page and own the rest of their last one, so the rounded range stays inside the allocation.
constexpr size_t kGpuPage = size_t(64) << 10;

ibv_context* open_by_name(const Library& l, const std::string& name) {
  int count = 0;
  ibv_device** devices = l.get_device_list(&count);
  if (devices == nullptr) {
    throw std::runtime_error("doca transport: ibv_get_device_list failed (errno " +
                             std::to_string(errno) + "); is an RDMA driver loaded?");
  }
  ibv_context* context = nullptr;
  bool found = false, mlx5 = false;
  std::string names;
  for (int i = 0; i < count; ++i) {
    const std::string here = l.get_device_name(devices[i]);
    names += (names.empty() ? "" : ", ") + here;
    if (here != name) continue;
    found = true;
    mlx5 = l.mlx5_is_supported(devices[i]);
    if (mlx5) context = l.open_device(devices[i]);
  }
  l.free_device_list(devices);
  if (!found) {
    throw std::runtime_error("doca transport: NIC " + name + " not found (RDMA devices: " +
                             (names.empty() ? "none" : names) + "); fix HYBRID_EP_NIC_MAPPING");
  }
  if (!mlx5) {
    throw std::runtime_error("doca transport: NIC " + name +
                             " is not an mlx5 (ConnectX) device; GPUNetIO drives only those");
  }
  if (context == nullptr) {
    throw std::runtime_error("doca transport: ibv_open_device(" + name + ") failed");
  }
  return context;
}

}  // namespace

Nic::Nic(const NicChoice& choice, doca_gpu_t* gpu, void* buffer, size_t bytes, void* sink,
         size_t sink_bytes)
    : choice_(choice) {
  const Library& l = library();
  try {
    context_ = open_by_name(l, choice.name);
    pd_ = l.alloc_pd(context_);
    if (pd_ == nullptr) throw std::runtime_error("doca transport: ibv_alloc_pd failed");
    if (l.query_port(context_, uint8_t(choice.port), &port_) != 0) {
      throw std::runtime_error("doca transport: ibv_query_port(" + choice.name + ", port " +
                               std::to_string(choice.port) +
                               ") failed; fix the port in "
                               "HYBRID_EP_NIC_MAPPING");
    }
    if (port_.state != ibv::kPortActive) {
      throw std::runtime_error("doca transport: " + choice.name + " port " +
                               std::to_string(choice.port) + " is not active");
    }
    if (l.query_gid(context_, uint8_t(choice.port), choice.gid_index, &gid_) != 0) {
      throw std::runtime_error("doca transport: GID index " + std::to_string(choice.gid_index) +
                               " of " + choice.name +
                               " cannot be read; set "
                               "HYBRID_EP_IB_GID_INDEX to a valid index");
    }
    check(l.dev_open(pd_, &device_), "doca_verbs_dev_open");
    doca_verbs_device_attr* attr = nullptr;
    check(l.query_device(context_, &attr), "doca_verbs_query_device");
    max_qp_wr_ = l.max_qp_wr(attr);
    l.device_attr_free(attr);
    buffer_ = register_memory(gpu, buffer, bytes, "the registered buffer");
    sink_ = register_memory(gpu, sink, sink_bytes, "the signal sink");
  } catch (...) {
    release();
    throw;
  }
}

Nic::~Nic() { release(); }

// DMA-BUF first (no kernel module beyond the GPU driver); peer memory (nvidia-peermem) when the
// kernel, driver or library has no DMA-BUF path.
Registration Nic::register_memory(doca_gpu_t* gpu, void* address, size_t bytes,
                                  const char* what) const {
  const Library& l = library();
  std::string dmabuf_failure = "ibv_reg_dmabuf_mr missing from libibverbs";
  if (l.reg_dmabuf_mr != nullptr) {
    const size_t span = (bytes + kGpuPage - 1) / kGpuPage * kGpuPage;
    int fd = -1;
    const doca_error_t status = l.get_dmabuf_fd(gpu, address, span, &fd);
    if (status == DOCA_SUCCESS && fd >= 0) {
      ibv_mr* mr = l.reg_dmabuf_mr(pd_, 0, span, reinterpret_cast<uint64_t>(address), fd, kAccess);
      const int error = errno;
      close(fd);
      if (mr != nullptr) return {mr, "dma-buf"};
      dmabuf_failure = std::string("ibv_reg_dmabuf_mr: ") + std::strerror(error);
    } else {
      dmabuf_failure = "doca_gpu_get_dmabuf_fd: DOCA error " + std::to_string(int(status));
    }
  }
  if (ibv_mr* mr = l.reg_mr(pd_, address, bytes, kAccess)) return {mr, "peer memory"};
  throw std::runtime_error(std::string("doca transport: cannot register ") + what + " with " +
                           choice_.name + ": DMA-BUF failed (" + dmabuf_failure +
                           ") and peer memory failed (ibv_reg_mr: " + std::strerror(errno) +
                           "); use a driver and kernel with DMA-BUF, or load nvidia_peermem");
}

void Nic::release() noexcept {
  const Library& l = library();
  if (sink_.mr != nullptr) l.dereg_mr(sink_.mr);
  if (buffer_.mr != nullptr) l.dereg_mr(buffer_.mr);
  sink_ = buffer_ = Registration{};
  if (device_ != nullptr) l.dev_close(device_);
  device_ = nullptr;
  if (pd_ != nullptr) l.dealloc_pd(pd_);
  pd_ = nullptr;
  if (context_ != nullptr) l.close_device(context_);
  context_ = nullptr;
}

std::string Nic::describe() const {
  return choice_.name + ":" + std::to_string(choice_.port) + " (" +
         (infiniband() ? "InfiniBand" : "RoCE, GID index " + std::to_string(choice_.gid_index)) +
         ", memory by " + buffer_.how + ")";
}

}  // namespace hybrid_ep::doca

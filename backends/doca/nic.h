// One RDMA NIC as the doca transport uses it: the verbs device and protection domain, the
// port's address (LID, GID), the DOCA verbs device, and this rank's registered memory (the
// symmetric buffer peers write into, and the small sink that fetch-adds return into).
#pragma once

#include <cstddef>
#include <string>

#include "doca_library.h"

namespace hybrid_ep::doca {

// A NIC and port for this GPU, as the Python layer chose it (HYBRID_EP_NIC_MAPPING or PCIe
// distance) together with the GID index it resolved (HYBRID_EP_IB_GID_INDEX or auto).
struct NicChoice {
  std::string name;  // e.g. mlx5_0
  int port = 1;
  int gid_index = 0;
};

struct Registration {
  ibv_mr* mr = nullptr;
  const char* how = "";  // "dma-buf" or "peer memory"
};

class Nic {
 public:
  Nic(const NicChoice& choice, doca_gpu_t* gpu, void* buffer, size_t bytes, void* sink,
      size_t sink_bytes);
  ~Nic();
  Nic(const Nic&) = delete;
  Nic& operator=(const Nic&) = delete;

  const NicChoice& choice() const { return choice_; }
  ibv_pd* pd() const { return pd_; }
  doca_dev_t* device() const { return device_; }
  const ibv_port_attr& port() const { return port_; }
  const ibv_gid& gid() const { return gid_; }
  bool infiniband() const { return port_.link_layer == ibv::kLinkLayerInfiniBand; }
  uint32_t buffer_lkey() const { return buffer_.mr->lkey; }
  uint32_t buffer_rkey() const { return buffer_.mr->rkey; }
  uint32_t sink_lkey() const { return sink_.mr->lkey; }
  uint32_t max_queue_depth() const { return max_qp_wr_; }
  std::string describe() const;

 private:
  Registration register_memory(doca_gpu_t* gpu, void* address, size_t bytes,
                               const char* what) const;
  void release() noexcept;

  NicChoice choice_;
  ibv_context* context_ = nullptr;
  ibv_pd* pd_ = nullptr;
  doca_dev_t* device_ = nullptr;
  ibv_port_attr port_{};
  ibv_gid gid_{};
  uint32_t max_qp_wr_ = 0;
  Registration buffer_, sink_;
};

}  // namespace hybrid_ep::doca

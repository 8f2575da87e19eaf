// The doca transport's queue pairs: for every channel and every other domain one RC queue
// pair on the channel's NIC, created in GPU memory by DOCA GPUNetIO, connected to the peer's
// matching queue pair from its bootstrap blob, and exported to the GPU. When DOCA resolves a
// queue pair to CPU-proxy mode (no GPU doorbells on this system), a host thread drives it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "nic.h"
#include "options.h"
#include "transport_backend.h"

namespace hybrid_ep::doca {

class Network {
 public:
  // `buffer` / `sink`: this rank's registered buffer and signal sink (device memory).
  Network(const Options& options, int nodes, int node_rank, int channels, void* buffer,
          size_t bytes, void* sink, size_t sink_bytes);
  ~Network();
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  std::string blob() const;  // what the peers need: addresses, keys, queue pair numbers
  // blobs[n]: the peer of domain n; returns the routes [channels][nodes] for the device.
  std::vector<DocaRoute> connect(const std::vector<std::string>& blobs);
  // Completion errors DOCA recorded on our queue pairs, for the fault report ("" if none).
  std::string queue_errors() const;
  std::string describe() const;

 private:
  struct QueuePair {
    doca_gpu_verbs_qp_hl* hl = nullptr;
    doca_verbs_ah_attr_t* address = nullptr;
    uint32_t number = 0;
  };
  QueuePair& at(int channel, int node) { return qps_[size_t(channel) * nodes_ + node]; }
  const Nic& nic_of(int channel) const { return *nics_[size_t(channel) % nics_.size()]; }
  void create_queue_pair(int channel, int node);
  void connect_queue_pair(int channel, int node, const std::string& peer_blob);
  void progress_proxies();
  void release() noexcept;

  Options options_;
  int nodes_, node_rank_, channels_;
  void* buffer_;
  size_t bytes_;
  doca_gpu_t* gpu_ = nullptr;
  std::vector<std::unique_ptr<Nic>> nics_;
  std::vector<QueuePair> qps_;  // [channels][nodes]; our own domain's entries stay empty
  std::vector<doca_gpu_verbs_qp*> proxied_;
  std::atomic<bool> stop_{false};
  std::thread proxy_;
};

}  // namespace hybrid_ep::doca

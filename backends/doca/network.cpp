#include "network.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "hybrid_ep/common/cuda_check.h"

namespace hybrid_ep::doca {
namespace {

constexpr uint32_t kBlobMagic = 0x48455044;  // "HEPD"
constexpr uint32_t kBlobVersion = 1;
// Outstanding RDMA reads/atomics per queue pair, both ways: our only atomics are the signals,
// and ConnectX NICs accept this many.
constexpr int kRdAtomic = 16;

struct BlobHeader {
  uint32_t magic, version;
  int32_t nodes, node_rank, channels, nics;
  uint64_t buffer_address, buffer_bytes;
};
struct BlobNic {
  uint8_t gid[16];
  uint32_t rkey;
  uint16_t lid;
  uint8_t infiniband;
  uint8_t active_mtu;
};

template <typename T>
void append(std::string& out, const T& value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

template <typename T>
T take(const std::string& blob, size_t& at, int node) {
  if (at + sizeof(T) > blob.size()) {
    throw std::invalid_argument("doca transport: the bootstrap blob of domain " +
                                std::to_string(node) + " is truncated");
  }
  T value;
  std::memcpy(&value, blob.data() + at, sizeof(T));
  at += sizeof(T);
  return value;
}

struct PeerView {
  BlobHeader header;
  std::vector<BlobNic> nics;
  std::vector<int32_t> nic_of_channel;
  std::vector<uint32_t> qp_numbers;  // [channels][nodes]
};

PeerView parse(const std::string& blob, int node) {
  PeerView v;
  size_t at = 0;
  v.header = take<BlobHeader>(blob, at, node);
  if (v.header.magic != kBlobMagic || v.header.version != kBlobVersion) {
    throw std::invalid_argument("doca transport: domain " + std::to_string(node) +
                                " sent a bootstrap blob of another transport or version "
                                "(is every rank running the same doca build?)");
  }
  for (int i = 0; i < v.header.nics; ++i) v.nics.push_back(take<BlobNic>(blob, at, node));
  for (int c = 0; c < v.header.channels; ++c) {
    v.nic_of_channel.push_back(take<int32_t>(blob, at, node));
  }
  for (int i = 0; i < v.header.channels * v.header.nodes; ++i) {
    v.qp_numbers.push_back(take<uint32_t>(blob, at, node));
  }
  return v;
}

std::string gpu_bus_id() {
  int device = 0;
  HYBRID_EP_CUDA_CHECK(cudaGetDevice(&device));
  char bus[32] = {};
  HYBRID_EP_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof(bus), device));
  return bus;
}

bool ipv4_mapped(const uint8_t* gid) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid, prefix, sizeof(prefix)) == 0;
}

}  // namespace

Network::Network(const Options& options, int nodes, int node_rank, int channels, void* buffer,
                 size_t bytes, void* sink, size_t sink_bytes)
    : options_(options),
      nodes_(nodes),
      node_rank_(node_rank),
      channels_(channels),
      buffer_(buffer),
      bytes_(bytes) {
  const Library& l = library();
  try {
    check(l.gpu_create(gpu_bus_id().c_str(), &gpu_), "doca_gpu_create");
    // A channel beyond the NICs reuses them round-robin; NICs beyond the channels stay idle.
    const size_t used = std::min(options_.nics.size(), size_t(channels_));
    for (size_t i = 0; i < used; ++i) {
      nics_.push_back(
          std::make_unique<Nic>(options_.nics[i], gpu_, buffer, bytes, sink, sink_bytes));
      if (uint32_t(options_.qp_depth) > nics_.back()->max_queue_depth()) {
        throw std::invalid_argument(
            "doca transport: HYBRID_EP_DOCA_QP_DEPTH resolved to " +
            std::to_string(options_.qp_depth) + " work requests, more than " +
            options_.nics[i].name + " allows (" + std::to_string(nics_.back()->max_queue_depth()) +
            "); raise HYBRID_EP_NUM_CHANNELS so fewer blocks share each queue pair, or lower "
            "NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API / NUM_OF_TOKENS_PER_CHUNK_COMBINE_API");
      }
    }
    qps_.resize(size_t(channels_) * nodes_);
    for (int c = 0; c < channels_; ++c) {
      for (int n = 0; n < nodes_; ++n) {
        if (n != node_rank_) create_queue_pair(c, n);
      }
    }
    if (!proxied_.empty()) proxy_ = std::thread([this] { progress_proxies(); });
  } catch (...) {
    release();
    throw;
  }
}

Network::~Network() { release(); }

void Network::create_queue_pair(int channel, int node) {
  const Library& l = library();
  const Nic& nic = nic_of(channel);
  doca_gpu_verbs_qp_init_attr_hl attr{};
  attr.gpu_dev = gpu_;
  attr.net_dev = nic.device();
  attr.ibpd = nic.pd();
  attr.sq_nwqe = uint16_t(options_.qp_depth);
  attr.cq_type = DOCA_GPUNETIO_VERBS_CQ_64B;  // one CQE per WQE in GPU memory: flush polls it
  attr.nic_handler = DOCA_GPUNETIO_VERBS_NIC_HANDLER_AUTO;
  attr.mreg_type = DOCA_GPUNETIO_VERBS_MEM_REG_TYPE_DEFAULT;
  attr.send_dbr_mode_ext = DOCA_GPUNETIO_VERBS_SEND_DBR_MODE_EXT_VALID_DBR;
  attr.cq_collapsed = false;
  // IBTA ordering: a signal's fetch-add executes after the writes before it on the queue pair.
  attr.ordering_semantic = DOCA_VERBS_QP_ORDERING_SEMANTIC_IBTA;
  QueuePair& qp = at(channel, node);
  check(l.create_qp(&attr, &qp.hl), "doca_gpu_verbs_create_qp_hl");
  check(l.qp_number(qp.hl->qp, &qp.number), "doca_verbs_qp_get_qpn");
  if (qp.hl->nic_handler & DOCA_GPUNETIO_VERBS_NIC_HANDLER_FLAG_CPU_PROXY) {
    proxied_.push_back(qp.hl->qp_gverbs);
  }
}

std::string Network::blob() const {
  std::string out;
  append(out,
         BlobHeader{kBlobMagic, kBlobVersion, nodes_, node_rank_, channels_, int32_t(nics_.size()),
                    reinterpret_cast<uint64_t>(buffer_), uint64_t(bytes_)});
  for (const auto& nic : nics_) {
    BlobNic b{};
    std::memcpy(b.gid, nic->gid().raw, sizeof(b.gid));
    b.rkey = nic->buffer_rkey();
    b.lid = nic->port().lid;
    b.infiniband = nic->infiniband();
    b.active_mtu = uint8_t(nic->port().active_mtu);
    append(out, b);
  }
  for (int c = 0; c < channels_; ++c) append(out, int32_t(size_t(c) % nics_.size()));
  for (const QueuePair& qp : qps_) append(out, qp.number);
  return out;
}

std::vector<DocaRoute> Network::connect(const std::vector<std::string>& blobs) {
  std::vector<DocaRoute> routes(size_t(channels_) * nodes_, DocaRoute{});
  for (int n = 0; n < nodes_; ++n) {
    if (n == node_rank_) continue;
    const PeerView peer = parse(blobs[n], n);
    if (peer.header.nodes != nodes_ || peer.header.channels != channels_ ||
        peer.header.node_rank != n) {
      throw std::invalid_argument("doca transport: domain " + std::to_string(n) + " reports " +
                                  std::to_string(peer.header.nodes) + " domains and " +
                                  std::to_string(peer.header.channels) + " channels, this rank " +
                                  std::to_string(nodes_) + " and " + std::to_string(channels_) +
                                  " (HYBRID_EP_NUM_CHANNELS must be the same on every rank)");
    }
    for (int c = 0; c < channels_; ++c) {
      connect_queue_pair(c, n, blobs[n]);
      const Nic& nic = nic_of(c);
      const BlobNic& far = peer.nics[size_t(peer.nic_of_channel[c])];
      DocaRoute& route = routes[size_t(c) * nodes_ + n];
      check(library().qp_dev(at(c, n).hl->qp_gverbs, &route.qp), "doca_gpu_verbs_get_qp_dev");
      route.remote_base = peer.header.buffer_address;
      route.rkey_be = __builtin_bswap32(far.rkey);
      route.lkey_be = __builtin_bswap32(nic.buffer_lkey());
      route.sink_lkey_be = __builtin_bswap32(nic.sink_lkey());
    }
  }
  return routes;
}

// RESET -> INIT -> RTR -> RTS against the peer's queue pair of (channel, our domain).
void Network::connect_queue_pair(int channel, int node, const std::string& peer_blob) {
  const Library& l = library();
  const PeerView peer = parse(peer_blob, node);
  const Nic& nic = nic_of(channel);
  const BlobNic& far = peer.nics[size_t(peer.nic_of_channel[channel])];
  if (bool(far.infiniband) != nic.infiniband()) {
    throw std::invalid_argument("doca transport: channel " + std::to_string(channel) +
                                " joins an InfiniBand and a RoCE port (domain " +
                                std::to_string(node) + "); fix HYBRID_EP_NIC_MAPPING");
  }
  QueuePair& qp = at(channel, node);
  const uint32_t remote_qp = peer.qp_numbers[size_t(channel) * nodes_ + node_rank_];

  check(l.ah_create(nic.device(), &qp.address), "doca_verbs_ah_attr_create");
  doca_verbs_gid gid{};
  std::memcpy(gid.raw, far.gid, sizeof(gid.raw));
  if (nic.infiniband()) {
    check(l.ah_set_addr_type(qp.address, DOCA_VERBS_ADDR_TYPE_IB_NO_GRH), "ah addr type");
    check(l.ah_set_dlid(qp.address, far.lid), "ah dlid");
  } else {
    check(l.ah_set_addr_type(qp.address, ipv4_mapped(far.gid) ? DOCA_VERBS_ADDR_TYPE_IPv4
                                                              : DOCA_VERBS_ADDR_TYPE_IPv6),
          "ah addr type");
    check(l.ah_set_hop_limit(qp.address, 64), "ah hop limit");
    check(l.ah_set_traffic_class(qp.address, uint8_t(options_.traffic_class)), "ah traffic class");
  }
  check(l.ah_set_gid(qp.address, gid), "ah gid");
  check(l.ah_set_sgid_index(qp.address, uint8_t(nic.choice().gid_index)), "ah sgid index");
  check(l.ah_set_sl(qp.address, 0), "ah sl");

  doca_verbs_qp_attr_t* attr = nullptr;
  check(l.qp_attr_create(&attr), "doca_verbs_qp_attr_create");
  try {
    const int mtu = std::min<int>(nic.port().active_mtu, far.active_mtu);
    check(l.set_remote_write(attr, 1), "qp attr remote write");
    check(l.set_remote_read(attr, 1), "qp attr remote read");
    check(l.set_atomic_mode(attr, DOCA_VERBS_QP_ATOMIC_MODE_IB_SPEC), "qp attr atomic mode");
    check(l.set_pkey_index(attr, 0), "qp attr pkey");
    check(l.set_port_num(attr, uint16_t(nic.choice().port)), "qp attr port");
    check(l.set_next_state(attr, DOCA_VERBS_QP_STATE_INIT), "qp attr state");
    check(l.qp_modify(qp.hl->qp, attr,
                      DOCA_VERBS_QP_ATTR_NEXT_STATE | DOCA_VERBS_QP_ATTR_ALLOW_REMOTE_WRITE |
                          DOCA_VERBS_QP_ATTR_ALLOW_REMOTE_READ | DOCA_VERBS_QP_ATTR_ATOMIC_MODE |
                          DOCA_VERBS_QP_ATTR_PKEY_INDEX | DOCA_VERBS_QP_ATTR_PORT_NUM),
          "queue pair to INIT");
    // ibv_mtu counts 1 = 256 bytes ... 5 = 4096 bytes; DOCA's enum counts from 0.
    check(l.set_path_mtu(attr, doca_verbs_mtu_size(mtu - 1)), "qp attr mtu");
    check(l.set_rq_psn(attr, 0), "qp attr rq psn");
    check(l.set_dest_qp(attr, remote_qp), "qp attr dest qp");
    check(l.set_ah_attr(attr, qp.address), "qp attr address");
    check(l.set_min_rnr_timer(attr, 12), "qp attr rnr timer");
    check(l.set_max_dest_rd_atomic(attr, kRdAtomic), "qp attr dest rd atomic");
    check(l.set_next_state(attr, DOCA_VERBS_QP_STATE_RTR), "qp attr state");
    check(l.qp_modify(qp.hl->qp, attr,
                      DOCA_VERBS_QP_ATTR_NEXT_STATE | DOCA_VERBS_QP_ATTR_RQ_PSN |
                          DOCA_VERBS_QP_ATTR_DEST_QP_NUM | DOCA_VERBS_QP_ATTR_PATH_MTU |
                          DOCA_VERBS_QP_ATTR_AH_ATTR | DOCA_VERBS_QP_ATTR_MIN_RNR_TIMER |
                          DOCA_VERBS_QP_ATTR_MAX_DEST_RD_ATOMIC),
          "queue pair to RTR");
    check(l.set_sq_psn(attr, 0), "qp attr sq psn");
    check(l.set_ack_timeout(attr, 20), "qp attr ack timeout");
    check(l.set_retry_cnt(attr, 7), "qp attr retry");
    check(l.set_rnr_retry(attr, 7), "qp attr rnr retry");
    check(l.set_max_rd_atomic(attr, kRdAtomic), "qp attr rd atomic");
    check(l.set_next_state(attr, DOCA_VERBS_QP_STATE_RTS), "qp attr state");
    check(l.qp_modify(qp.hl->qp, attr,
                      DOCA_VERBS_QP_ATTR_NEXT_STATE | DOCA_VERBS_QP_ATTR_SQ_PSN |
                          DOCA_VERBS_QP_ATTR_ACK_TIMEOUT | DOCA_VERBS_QP_ATTR_RETRY_CNT |
                          DOCA_VERBS_QP_ATTR_RNR_RETRY | DOCA_VERBS_QP_ATTR_MAX_QP_RD_ATOMIC),
          "queue pair to RTS");
  } catch (...) {
    l.qp_attr_destroy(attr);
    throw;
  }
  l.qp_attr_destroy(attr);
}

void Network::progress_proxies() {
  const Library& l = library();
  while (!stop_.load(std::memory_order_relaxed)) {
    bool progressed = false;
    for (doca_gpu_verbs_qp* qp : proxied_) {
      bool here = false;
      l.proxy_progress(qp, &here);
      progressed |= here;
    }
    if (!progressed) std::this_thread::yield();
  }
}

std::string Network::queue_errors() const {
  const Library& l = library();
  std::string out;
  for (size_t i = 0; i < qps_.size(); ++i) {
    if (qps_[i].hl == nullptr) continue;
    doca_gpu_verbs_qp_error_info info{};
    if (l.query_last_error(qps_[i].hl->qp_gverbs, &info) == DOCA_SUCCESS && info.has_error) {
      out += "channel " + std::to_string(i / nodes_) + " to domain " + std::to_string(i % nodes_) +
             ": syndrome " + std::to_string(info.syndrome) + ", vendor syndrome " +
             std::to_string(info.vendor_err_synd) + "; ";
    }
  }
  return out;
}

std::string Network::describe() const {
  std::string out;
  for (const auto& nic : nics_) out += (out.empty() ? "" : ", ") + nic->describe();
  return out + "; " + std::to_string(options_.qp_depth) + "-entry queue pairs" +
         (proxied_.empty() ? "" : ", doorbells by a CPU proxy thread");
}

void Network::release() noexcept {
  stop_.store(true);
  if (proxy_.joinable()) proxy_.join();
  const Library& l = library();
  for (QueuePair& qp : qps_) {
    if (qp.hl != nullptr) l.destroy_qp(qp.hl);
    if (qp.address != nullptr) l.ah_destroy(qp.address);
    qp = QueuePair{};
  }
  nics_.clear();
  if (gpu_ != nullptr) l.gpu_destroy(gpu_);
  gpu_ = nullptr;
}

}  // namespace hybrid_ep::doca

// The few rdma-core (libibverbs, libmlx5) entry points and structures the doca backend uses,
// declared here from their stable ABI so that the build needs neither the DOCA host library
// nor rdma-core's development headers: both libraries are loaded at run time (doca_library.h).
// Only structures whose layout rdma-core keeps fixed across releases are spelled out (the
// leading fields of ibv_mr, ibv_gid, and the port attributes up to link_layer); everything
// else stays opaque.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

struct ibv_device;
struct ibv_context;
struct ibv_pd;

struct ibv_mr {
  ibv_context* context;
  ibv_pd* pd;
  void* addr;
  size_t length;
  uint32_t handle;
  uint32_t lkey;
  uint32_t rkey;
};

union ibv_gid {
  uint8_t raw[16];
  struct {
    uint64_t subnet_prefix;
    uint64_t interface_id;
  } global;
};

// ibv_query_port's exported (compat) layout; the padding leaves room for the fields newer
// releases append, so a newer library never writes past our object.
struct ibv_port_attr {
  int state;
  int max_mtu;
  int active_mtu;  // enum ibv_mtu: 1 = 256 bytes ... 5 = 4096 bytes
  int gid_tbl_len;
  uint32_t port_cap_flags;
  uint32_t max_msg_sz;
  uint32_t bad_pkey_cntr;
  uint32_t qkey_viol_cntr;
  uint16_t pkey_tbl_len;
  uint16_t lid;
  uint16_t sm_lid;
  uint8_t lmc;
  uint8_t max_vl_num;
  uint8_t sm_sl;
  uint8_t subnet_timeout;
  uint8_t init_type_reply;
  uint8_t active_width;
  uint8_t active_speed;
  uint8_t phys_state;
  uint8_t link_layer;  // 1: InfiniBand, 2: Ethernet (RoCE)
  uint8_t flags;
  uint8_t reserved[64];
};

}  // extern "C"

namespace hybrid_ep::ibv {

constexpr int kAccessLocalWrite = 1;
constexpr int kAccessRemoteWrite = 2;
constexpr int kAccessRemoteRead = 4;
constexpr int kAccessRemoteAtomic = 8;
constexpr uint8_t kLinkLayerInfiniBand = 1;
constexpr uint8_t kLinkLayerEthernet = 2;
constexpr int kPortActive = 4;

}  // namespace hybrid_ep::ibv

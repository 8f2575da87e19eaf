// The host libraries of the doca transport, loaded at run time (dlopen) so that the build needs
// no DOCA host library and a build without a NIC still imports: DOCA GPUNetIO's host library
// (libdoca_gpunetio_host, the API of the headers we compile against), libibverbs and libmlx5.
// A library that is absent raises TransportUnavailable naming it and HYBRID_EP_DOCA_LIB_DIR.
#pragma once

#include <string>

#include "host/doca_gpunetio.h"
#include "host/doca_gpunetio_high_level.h"
#include "host/doca_verbs.h"
#include "ibverbs_abi.h"

namespace hybrid_ep::doca {

// The function table. DOCA entries take their types from DOCA's own declarations, so a change
// of signature in the headers is a compile error here rather than a wrong call at run time.
struct Library {
  // libibverbs.so.1
  ibv_device** (*get_device_list)(int*);
  void (*free_device_list)(ibv_device**);
  const char* (*get_device_name)(ibv_device*);
  ibv_context* (*open_device)(ibv_device*);
  int (*close_device)(ibv_context*);
  ibv_pd* (*alloc_pd)(ibv_context*);
  int (*dealloc_pd)(ibv_pd*);
  int (*query_port)(ibv_context*, uint8_t, ibv_port_attr*);
  int (*query_gid)(ibv_context*, uint8_t, int, ibv_gid*);
  ibv_mr* (*reg_mr)(ibv_pd*, void*, size_t, int);
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd*, uint64_t, size_t, uint64_t, int, int);  // may be null
  int (*dereg_mr)(ibv_mr*);
  // libmlx5.so.1
  bool (*mlx5_is_supported)(ibv_device*);
  // DOCA GPUNetIO host library
  decltype(&doca_gpu_verbs_get_library_version) get_library_version;
  decltype(&doca_gpu_verbs_check_device_code_compatibility) check_device_code;
  decltype(&doca_gpu_verbs_check_host_code_compatibility) check_host_code;
  decltype(&doca_gpu_create) gpu_create;
  decltype(&doca_gpu_destroy) gpu_destroy;
  decltype(&doca_gpu_get_dmabuf_fd) get_dmabuf_fd;
  decltype(&doca_verbs_dev_open) dev_open;
  decltype(&doca_verbs_dev_close) dev_close;
  decltype(&doca_verbs_query_device) query_device;
  decltype(&doca_verbs_device_attr_get_max_qp_wr) max_qp_wr;
  decltype(&doca_verbs_device_attr_free) device_attr_free;
  decltype(&doca_gpu_verbs_create_qp_hl) create_qp;
  decltype(&doca_gpu_verbs_destroy_qp_hl) destroy_qp;
  decltype(&doca_gpu_verbs_get_qp_dev) qp_dev;
  decltype(&doca_gpu_verbs_cpu_proxy_progress) proxy_progress;
  decltype(&doca_gpu_verbs_query_last_error) query_last_error;
  decltype(&doca_verbs_qp_get_qpn) qp_number;
  decltype(&doca_verbs_qp_modify) qp_modify;
  decltype(&doca_verbs_qp_attr_create) qp_attr_create;
  decltype(&doca_verbs_qp_attr_destroy) qp_attr_destroy;
  decltype(&doca_verbs_qp_attr_set_next_state) set_next_state;
  decltype(&doca_verbs_qp_attr_set_allow_remote_write) set_remote_write;
  decltype(&doca_verbs_qp_attr_set_allow_remote_read) set_remote_read;
  decltype(&doca_verbs_qp_attr_set_atomic_mode) set_atomic_mode;
  decltype(&doca_verbs_qp_attr_set_pkey_index) set_pkey_index;
  decltype(&doca_verbs_qp_attr_set_port_num) set_port_num;
  decltype(&doca_verbs_qp_attr_set_path_mtu) set_path_mtu;
  decltype(&doca_verbs_qp_attr_set_rq_psn) set_rq_psn;
  decltype(&doca_verbs_qp_attr_set_sq_psn) set_sq_psn;
  decltype(&doca_verbs_qp_attr_set_dest_qp_num) set_dest_qp;
  decltype(&doca_verbs_qp_attr_set_ah_attr) set_ah_attr;
  decltype(&doca_verbs_qp_attr_set_min_rnr_timer) set_min_rnr_timer;
  decltype(&doca_verbs_qp_attr_set_ack_timeout) set_ack_timeout;
  decltype(&doca_verbs_qp_attr_set_retry_cnt) set_retry_cnt;
  decltype(&doca_verbs_qp_attr_set_rnr_retry) set_rnr_retry;
  decltype(&doca_verbs_qp_attr_set_max_rd_atomic) set_max_rd_atomic;
  decltype(&doca_verbs_qp_attr_set_max_dest_rd_atomic) set_max_dest_rd_atomic;
  decltype(&doca_verbs_ah_attr_create) ah_create;
  decltype(&doca_verbs_ah_attr_destroy) ah_destroy;
  decltype(&doca_verbs_ah_attr_set_gid) ah_set_gid;
  decltype(&doca_verbs_ah_attr_set_addr_type) ah_set_addr_type;
  decltype(&doca_verbs_ah_attr_set_dlid) ah_set_dlid;
  decltype(&doca_verbs_ah_attr_set_sl) ah_set_sl;
  decltype(&doca_verbs_ah_attr_set_sgid_index) ah_set_sgid_index;
  decltype(&doca_verbs_ah_attr_set_hop_limit) ah_set_hop_limit;
  decltype(&doca_verbs_ah_attr_set_traffic_class) ah_set_traffic_class;

  std::string description;  // which files were loaded, for diagnostics
};

// Loads the three libraries once per process (the first failure is remembered and rethrown);
// throws TransportUnavailable naming the missing library or symbol and what to set.
const Library& library();

// Throws std::runtime_error "`what` failed: DOCA error N" when `status` is not DOCA_SUCCESS.
void check(doca_error_t status, const char* what);

}  // namespace hybrid_ep::doca

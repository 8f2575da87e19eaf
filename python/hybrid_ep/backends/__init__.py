"""Per-backend Python: what one build's transport needs from the host side.

- ``doca``: the NIC mapping, queue depths and options of the doca build;
- ``nic_topology``: which RDMA NICs serve a GPU (sysfs, PCIe distance);
- ``nixl_control``: the nixl build's control plane (NIXL agents) and its settings;
- ``nvshmem``: the NVSHMEM environment the nvshmem build sets;
- ``p2p_wire``: the p2p build's network emulation (HYBRID_EP_P2P_WIRE).

``transport_options`` picks among them for the build at hand; nothing else names a backend.
"""

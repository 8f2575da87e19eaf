"""The doca build loads DOCA GPUNetIO's host library, libibverbs and libmlx5 at run time: where
one is absent, the doca build's hybrid_ep._C raises TransportUnavailableError (a RuntimeError)
naming the library and HYBRID_EP_DOCA_LIB_DIR. Runs the real dlopen code of build/doca
(tests/doca_build.py); stand-in libraries (empty .so files) steer which one is missing."""

from __future__ import annotations

import doca_build


def _assert_unavailable(out: dict, *fragments: str) -> None:
    assert out["transport"] == "doca", out
    assert out.get("error") == "TransportUnavailableError", out
    assert out["is_runtime_error"], out
    for fragment in ("HYBRID_EP_DOCA_LIB_DIR", *fragments):
        assert fragment in out["message"], (fragment, out["message"])


def test_absent_libraries_raise_naming_the_library_and_the_variable(tmp_path):
    # An empty folder in front of the loader path; on a machine with rdma-core the first
    # library found missing is DOCA's, on one without it libibverbs.
    out = doca_build.run("preflight", lib_dir=str(tmp_path), library_path=str(tmp_path))
    _assert_unavailable(out, "cannot load", f"HYBRID_EP_DOCA_LIB_DIR={tmp_path}")
    assert any(
        name in out["message"]
        for name in ("libibverbs.so.1", "libmlx5.so.1", "libdoca_gpunetio_host.so")
    ), out


def test_missing_doca_library_is_named_with_every_file_name_tried(tmp_path):
    doca_build.stub_libraries(tmp_path, ["libibverbs.so.1", "libmlx5.so.1"])
    out = doca_build.run("preflight", lib_dir=str(tmp_path))
    _assert_unavailable(
        out, "DOCA GPUNetIO host library", "libdoca_gpunetio_host.so.4", "libdoca_gpunetio.so"
    )


def test_a_library_without_the_entry_points_is_named_with_the_symbol(tmp_path):
    doca_build.stub_libraries(
        tmp_path, ["libibverbs.so.1", "libmlx5.so.1", "libdoca_gpunetio_host.so.4"]
    )
    out = doca_build.run("preflight", lib_dir=str(tmp_path))
    _assert_unavailable(out, "has no symbol ibv_get_device_list", str(tmp_path))


def test_the_installed_build_has_the_same_hook():
    import hybrid_ep._C as C

    assert issubclass(C.TransportUnavailableError, RuntimeError)
    if C.build_info()["transport"] == "p2p":
        assert C.transport_preflight().startswith("p2p")

"""build_info() describes the compiled extension (CI installs the package, so it is there)."""

from __future__ import annotations


def test_build_info():
    import hybrid_ep

    info = hybrid_ep.build_info()
    assert isinstance(info, dict)
    for key in ("transport", "cuda_architectures", "cuda_toolkit_version", "version"):
        assert key in info, f"build_info() lacks {key!r}: {sorted(info)}"
    assert info["transport"] in ("p2p", "nvshmem", "nixl", "doca"), info["transport"]

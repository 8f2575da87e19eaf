"""Values the Python side and the C++ core share have one source: the device status's codes and
wait sites come from the binding, which follows common/status.h; the runtime's defaults
equal the ones a buffer passes it (the environment's defaults, the constructor's)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hybrid_ep import buffer, device_status, native
from hybrid_ep.config import ENV_VARS, EnvSettings

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "csrc" / "hybrid_ep"


def _enum(text: str, name: str) -> dict[str, int]:
    body = re.search(rf"enum class {name}\b[^{{]*\{{(.*?)\}};", text, re.DOTALL)[1]
    body = re.sub(r"//[^\n]*", "", body)
    return {m[1]: int(m[2]) for m in re.finditer(r"(k\w+)\s*=\s*(\d+)", body)}


def _members(enum) -> dict[str, int]:
    return {name: int(value) for name, value in enum.__members__.items()}


def test_status_enums_of_the_binding_are_those_of_status_h():
    C = native.module()
    text = (CORE / "common" / "status.h").read_text()
    assert _members(C.StatusCode) == _enum(text, "StatusCode")
    assert _members(C.WaitSite) == _enum(text, "WaitSite")


def test_every_wait_site_has_a_description():
    assert set(device_status.WAIT_SITES) == set(native.module().WaitSite.__members__)


def test_domain_disagrees_bit_is_that_of_flags_cuh():
    text = (CORE / "kernels" / "common" / "flags.cuh").read_text()
    shift = re.search(r"kDomainDisagrees\s*=\s*1ull\s*<<\s*(\d+);", text)[1]
    assert device_status.DOMAIN_DISAGREES == 1 << int(shift)


def test_runtime_defaults_are_the_buffers(monkeypatch):
    for var in ENV_VARS:
        monkeypatch.delenv(var.name, raising=False)
    env = EnvSettings.read()
    rc = native.module().RuntimeConfig()
    pairs = {
        "stages_dispatch": env.stages_dispatch,
        "stages_combine": env.stages_g2s_combine,
        "dispatch_chunk": env.tokens_per_chunk_dispatch,
        "combine_chunk": env.tokens_per_chunk_combine,
        "timeout_s": env.timeout_s,
        "channels": env.num_channels,
        "combine_pieces": env.combine_pieces,
        "sms_dispatch": buffer.DEFAULT_SMS_DISPATCH,
        "sms_combine": buffer.DEFAULT_SMS_COMBINE,
        "sms_preprocessing": buffer.DEFAULT_SMS_PREPROCESSING,
    }
    for field, python in pairs.items():
        assert getattr(rc, field) == pytest.approx(python), field
    declared = {v.name: v.default for v in ENV_VARS}
    assert declared["NUM_OF_STAGES_DISPATCH_API"] == str(rc.stages_dispatch)
    assert declared["NUM_OF_STAGES_G2S_COMBINE_API"] == str(rc.stages_combine)


def _status(code: str, site: str, **fields) -> dict:
    C = native.module()
    return {"code": int(C.StatusCode.__members__[code]),
            "site": int(C.WaitSite.__members__[site]), "peer": 1, "slot": 3, "expected": 5,
            "seen": 4, "stamp": 0, **fields}


def test_status_is_raised_as_the_error_it_stands_for():
    from hybrid_ep.call_stamp import CallStamp
    from hybrid_ep.errors import HybridEPMismatchError, HybridEPTimeoutError
    from hybrid_ep.topology import Topology

    topo = Topology(rank=2, group_size=4, ranks_per_domain=2)  # domain 1, local rank 0
    with pytest.raises(HybridEPTimeoutError, match=r"network dispatch chunk for rank 2 \(the "
                       r"peer in domain 1\) \(slot 3\) timed out after 7 s"):
        device_status.raise_for_status(_status("kTimeout", "kNetworkFlag"), topo, 7.0)
    mine, theirs = CallStamp("dispatch", engine="cuda"), CallStamp("combine", engine="cuda")
    status = _status("kMismatch", "kBarrier", expected=mine.pack(), seen=theirs.pack())
    with pytest.raises(HybridEPMismatchError, match=r"found at the domain barrier: .* rank 3: "
                       r"combine"):
        device_status.raise_for_status(status, topo, 7.0)

"""Ranks that do not make the same call, or do not come, on the reference engine (issue 38):
every rank raises a clear error within HYBRID_EP_TIMEOUT_S instead of gloo aborting a process
or a collective blocking for the process group's timeout (cases/agreement.py). Also the
drop-in fixes: any default device, scaling_factor with BF16 ignored, one width check, and the
opt-in deep_ep alias."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from cases.agreement import MISMATCHES

W = 2


@pytest.mark.parametrize("kind", sorted(MISMATCHES))
def test_mismatched_call_raises_on_every_rank(pools, kind):
    messages = pools.run(W, "cases.agreement", "mismatch", kind=kind)
    assert all(messages), messages  # each rank returned the message it raised with
    print(messages[0])


def test_bad_input_on_one_rank_reaches_the_others_at_once(pools):
    results = pools.run(W, "cases.agreement", "bad_input_on_one_rank")
    assert [r["outcome"] for r in results] == ["own error", "mismatch"], results


def test_skipped_call_times_out_naming_the_rank(pools):
    results = pools.run(W, "cases.agreement", "skipped_call", limit_s=2.0)
    assert results[1] == {"skipped": True}
    assert "ranks [1]" in results[0]["message"], results[0]


def test_any_default_device(pools):
    assert pools.run(W, "cases.agreement", "default_device", device="meta") == [9, 9]


def test_scaling_factor_with_bf16_is_ignored(pools):
    warned = pools.run(W, "cases.agreement", "scaling_factor_with_bf16")
    assert all(count <= 1 for count in warned), warned


def test_rows_wider_than_hidden_dim_raise(pools):
    print(pools.run(W, "cases.agreement", "wide_hidden")[0])


_PEER_DIES = textwrap.dedent("""
    import os, sys, time, datetime
    import torch, torch.distributed as dist
    rank = int(sys.argv[1])
    os.environ["HYBRID_EP_TIMEOUT_S"] = "3"
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=300))
    from hybrid_ep import HybridEPBuffer, HybridEPTimeoutError
    import hybrid_ep.reference.movement as movement
    buf = HybridEPBuffer(dist.group.WORLD, hidden_dim=128, max_num_of_tokens_per_rank=8,
                         num_local_experts=2, num_of_hybrid_ep_ranks_per_nvlink_domain=2)
    if rank == 1:  # dies in the middle of the call, after the agreement
        movement.scatter_in_domain = lambda *a, **k: os._exit(3)
    hidden = torch.ones(8, 128, dtype=torch.bfloat16)
    routing = torch.ones(8, 4, dtype=torch.bool)
    start = time.monotonic()
    try:
        buf.dispatch(hidden, routing_map=routing, probs=routing.float())
    except HybridEPTimeoutError as error:
        print("RAISED", round(time.monotonic() - start, 1), str(error).splitlines()[0],
              flush=True)
        os._exit(0)  # the process group's teardown with a dead peer is not under test
    print("NO ERROR", flush=True)
    os._exit(1)
""")


def test_peer_killed_mid_call_raises(tmp_path):
    """A peer that dies after the call's agreement: the survivor's next collective of the call
    fails within HYBRID_EP_TIMEOUT_S (gloo notices the closed connection at once) and raises
    HybridEPTimeoutError naming the op, instead of blocking for the group's timeout."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    script = tmp_path / "peer_dies.py"
    script.write_text(_PEER_DIES)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), str(r), port], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert procs[1].returncode == 3, outs[1][-2000:]
    assert procs[0].returncode == 0, outs[0][-3000:]
    line = next(ln for ln in outs[0].splitlines() if ln.startswith("RAISED"))
    assert "dispatch" in line, line
    assert float(line.split()[1]) < 60, line


def _python(*args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=path) if path else None
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, check=False,
                          env=env, timeout=120)


def test_deep_ep_alias_is_opt_in(tmp_path):
    """Nothing named deep_ep exists until asked for; the in-process alias and the shim package
    both give hybrid_ep's class; a real deep_ep is never shadowed silently."""
    code = textwrap.dedent("""
        import importlib.util
        import hybrid_ep
        assert importlib.util.find_spec("deep_ep") is None, "deep_ep exists by default"
        module = hybrid_ep.install_as_deep_ep()
        from deep_ep import HybridEPBuffer
        assert HybridEPBuffer is hybrid_ep.HybridEPBuffer
        try:
            from deep_ep import Buffer  # noqa: F401
        except ImportError:
            pass
        else:
            raise AssertionError("deep_ep.Buffer exists")
        assert hybrid_ep.install_as_deep_ep() is not module  # again: fine, ours
        print("ok")
    """)
    result = _python("-c", code)
    assert result.returncode == 0 and "ok" in result.stdout, result.stdout + result.stderr

    shim = tmp_path / "shim"
    cli = _python("-m", "hybrid_ep", "deep-ep-shim", str(shim))
    assert cli.returncode == 0, cli.stdout + cli.stderr
    code = ("import deep_ep, hybrid_ep; assert deep_ep.HybridEPBuffer is hybrid_ep.HybridEPBuffer;"
            " hybrid_ep.install_as_deep_ep(); print('ok')")
    result = _python("-c", code, path=str(shim))
    assert result.returncode == 0 and "ok" in result.stdout, result.stdout + result.stderr

    real = tmp_path / "real"
    (real / "deep_ep").mkdir(parents=True)
    (real / "deep_ep" / "__init__.py").write_text("REAL = True\n")
    code = ("import hybrid_ep\ntry:\n    hybrid_ep.install_as_deep_ep()\nexcept RuntimeError as e:"
            "\n    print('refused', e)\nhybrid_ep.install_as_deep_ep(replace=True)\n"
            "import deep_ep\nassert not hasattr(deep_ep, 'REAL')\nprint('replaced')")
    result = _python("-c", code, path=str(real))
    assert "refused" in result.stdout and "replaced" in result.stdout, \
        result.stdout + result.stderr
    again = _python("-m", "hybrid_ep", "deep-ep-shim", str(real))
    assert again.returncode != 0 and "did not write" in again.stdout + again.stderr

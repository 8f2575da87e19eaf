"""The nixl transport's control plane: one NIXL agent per rank, driven from Python.

The agent (UCX backend, ``ucx_num_device_channels`` = HYBRID_EP_NUM_CHANNELS) registers this
rank's registered buffer (receive tiles and flags: the whole of it), exchanges metadata with
the peer of every other NVLink domain (through the process group, or etcd when
NIXL_ETCD_ENDPOINTS is set: NIXL reads that variable itself), connects to them and prepares
UCX memory views: a local view of our buffer and a remote view of each peer's. The views' device
addresses are what the C++ transport's ``connect`` takes (backends/nixl/transport_backend.h),
one 8-byte little-endian blob per domain. Every step that waits on a peer retries until
HYBRID_EP_TIMEOUT_S and then raises :class:`NixlPeerTimeout` naming the peer and the step.
"""

from __future__ import annotations

import re
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from ..topology import gather_objects

# The NIXL Python packages, in order: the nixl-cu13 wheel, then a NIXL install's own package.
_NIXL_MODULES = ("nixl_cu13._api", "nixl._api")
_RETRY_INTERVAL_S = 0.05


class NixlUnavailableError(RuntimeError):
    """The NIXL runtime (Python API and UCX plugin) is missing or unusable."""


class NixlPeerTimeout(TimeoutError):
    """A control-plane step with a peer did not succeed in time."""


@dataclass(frozen=True)
class Region:
    """A registered buffer: its address, size in bytes and device (CUDA index; 0 for DRAM)."""

    address: int
    size: int
    device: int

    @staticmethod
    def parse(bootstrap: bytes | str) -> Region:
        """From the nixl TransportHost's bootstrap(): "address bytes device" in decimal."""
        text = bootstrap.decode() if isinstance(bootstrap, bytes) else bootstrap
        address, size, device = (int(part) for part in text.split())
        return Region(address, size, device)


def load_nixl_api():
    """The module holding ``nixl_agent`` and ``nixl_agent_config``."""
    errors = []
    for name in _NIXL_MODULES:
        try:
            return __import__(name, fromlist=["nixl_agent"])
        except ImportError as error:
            errors.append(f"{name}: {error}")
    raise NixlUnavailableError(
        "nixl transport: the NIXL Python API is missing (" + "; ".join(errors) + "); install "
        "it with `python -m pip install nixl-cu13==1.5.1` (it brings its UCX)")


def make_agent(name: str, channels: int, api=None, progress_thread: bool = True):
    """A NIXL agent named ``name`` with the UCX backend and ``channels`` device channels.
    Without the progress thread, host-posted transfers to this agent complete only while it
    polls; the GPU data path posts and completes its own operations either way."""
    api = api or load_nixl_api()
    agent = api.nixl_agent(name, api.nixl_agent_config(enable_prog_thread=progress_thread,
                                                       backends=[]))
    if "UCX" not in agent.get_plugin_list():
        raise NixlUnavailableError(
            "nixl transport: NIXL found no UCX plugin (libplugin_UCX.so); its plugins are "
            f"{agent.get_plugin_list()} (set NIXL_PLUGIN_DIR, or reinstall nixl-cu13==1.5.1)")
    agent.create_backend("UCX", {"ucx_num_device_channels": str(channels)})
    return agent


def retry(step: str, peer: str, attempt: Callable[[], object], timeout_s: float,
          interval_s: float = _RETRY_INTERVAL_S):
    """Calls ``attempt`` until it returns a value other than None/False without raising, and
    returns that value; raises NixlPeerTimeout naming ``step`` and ``peer`` (and the last
    error) when ``timeout_s`` passes first. At least one attempt is made."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    tries = 0
    while True:
        tries += 1
        try:
            result = attempt()
            if result is not None and result is not False:
                return result
        except Exception as error:  # noqa: BLE001 - NIXL raises its own types; retried
            last = f"{type(error).__name__}: {error}"
        if time.monotonic() >= deadline:
            raise NixlPeerTimeout(
                f"nixl transport: {step} with {peer} did not succeed within {timeout_s:g} s "
                f"({tries} attempts; last: {last}); is that rank alive and in the same run "
                "(DEEPEP_NIXL_RUN_ID)?")
        time.sleep(interval_s)


def agent_name(run_id: str, rank: int) -> str:
    return f"hybrid-ep-{run_id}-rank{rank}"


class NixlControlPlane:
    """This rank's agent and the views of its peers; collective over ``group``.

    ``peers[n]`` is the global rank of our peer in domain n (our own rank for our domain).
    ``views=False`` stops after connecting (CPU tests: UCX makes memory views of VRAM only).
    """

    def __init__(self, group, rank: int, peers: list[int], region: Region, *, channels: int,
                 run_id: str | None, use_etcd: bool, timeout_s: float, mem_type: str = "VRAM",
                 views: bool = True, progress_thread: bool = True,
                 agent_factory: Callable = make_agent):
        self.rank = rank
        self.peers = peers
        self.node_rank = peers.index(rank)
        self.region = region
        self.mem_type = mem_type
        self.timeout_s = timeout_s
        self.use_etcd = use_etcd
        self._reg = None
        self._views: list[int] = []
        self.remote_names: dict[int, str] = {}  # domain -> the peer agent's name
        self.peer_regions: dict[int, Region] = {}
        self.blobs: list[bytes] = []
        # Names must agree across ranks: without a run id, rank 0 of the group draws one.
        run_id = run_id or gather_objects(uuid.uuid4().hex[:12], group)[0]
        self.name = agent_name(run_id, rank)
        self.agent = (agent_factory(self.name, channels) if agent_factory is not make_agent
                      else make_agent(self.name, channels, progress_thread=progress_thread))
        try:
            self._reg = self.agent.register_memory(
                [(region.address, region.size, region.device, "")], mem_type)
            regions = gather_objects((self.name, region), group)
            self.peer_regions = {n: regions[peers[n]][1] for n in self._other_domains()}
            if use_etcd:
                self._exchange_etcd(regions)
            else:
                self._exchange_group(group)
            self._connect_peers()
            if views:
                self._prepare_views()
        except BaseException:
            self.close()
            raise

    # -- steps -----------------------------------------------------------------------------------
    def _peer_label(self, n: int) -> str:
        return f"the peer of domain {n} (rank {self.peers[n]}, agent {self.remote_names[n]!r})"

    def _other_domains(self) -> list[int]:
        return [n for n in range(len(self.peers)) if n != self.node_rank]

    def _exchange_group(self, group) -> None:
        metadata = gather_objects(self.agent.get_agent_metadata(), group)
        for n in self._other_domains():
            peer = f"the peer of domain {n} (rank {self.peers[n]})"
            name = retry("metadata load", peer,
                         lambda n=n: self.agent.add_remote_agent(metadata[self.peers[n]]),
                         self.timeout_s)
            self.remote_names[n] = name.decode() if isinstance(name, bytes) else name

    def _exchange_etcd(self, regions) -> None:
        self.agent.send_local_metadata()
        for n in self._other_domains():
            name = regions[self.peers[n]][0]
            self.remote_names[n] = name

            def fetched(name=name):
                self.agent.fetch_remote_metadata(name)
                return self.agent.check_remote_metadata(name)

            retry("metadata fetch (etcd)", self._peer_label(n), fetched, self.timeout_s)

    def _connect_peers(self) -> None:
        for n in self._other_domains():
            def connected(n=n):
                self.agent.make_connection(self.remote_names[n])
                return True

            retry("connection", self._peer_label(n), connected, self.timeout_s)

    def _prepare_views(self) -> None:
        r = self.region
        local = self.agent.get_xfer_descs([(r.address, r.size, r.device)], self.mem_type)
        own = retry("local memory view", f"this rank ({self.rank})",
                    lambda: self._view(local), self.timeout_s)
        addresses = []
        for n in range(len(self.peers)):
            if n == self.node_rank:
                addresses.append(own)
                continue
            p = self.peer_regions[n]
            descs = self.agent.get_remote_descs(
                [(p.address, p.size, p.device, self.remote_names[n])], self.mem_type)
            addresses.append(retry("remote memory view", self._peer_label(n),
                                   lambda descs=descs: self._view(descs), self.timeout_s))
        self.blobs = [struct.pack("<Q", a) for a in addresses]

    def _view(self, descs) -> int:
        handle = self.agent.prep_mem_view(descs)
        self._views.append(handle)
        return handle

    # -- host-side transfer (tests and diagnostics) ----------------------------------------------
    def write(self, node: int, local_offset: int, remote_offset: int, size: int) -> None:
        """Writes ``size`` bytes of our registered buffer at ``local_offset`` to the peer of
        domain ``node`` at ``remote_offset``, from the host, and waits for completion."""
        r = self.region
        local = self.agent.get_xfer_descs([(r.address + local_offset, size, r.device)],
                                          self.mem_type)
        peer = self.peer_regions[node]
        remote = self.agent.get_xfer_descs([(peer.address + remote_offset, size, peer.device)],
                                           self.mem_type)
        handle = retry("transfer setup", self._peer_label(node),
                       lambda: self.agent.initialize_xfer("WRITE", local, remote,
                                                          self.remote_names[node]),
                       self.timeout_s)
        try:
            state = self.agent.transfer(handle)
            deadline = time.monotonic() + self.timeout_s
            while state == "PROC" and time.monotonic() < deadline:
                state = self.agent.check_xfer_state(handle)
            if state != "DONE":
                raise NixlPeerTimeout(f"nixl transport: host transfer to "
                                      f"{self._peer_label(node)} ended in state {state}")
        finally:
            self.agent.release_xfer_handle(handle)

    # -- teardown --------------------------------------------------------------------------------
    def close(self) -> None:
        """Releases the views, forgets the peers and deregisters the buffer; idempotent. Call it
        after the GPU is done with the views and before the buffer is freed."""
        agent = getattr(self, "agent", None)
        if agent is None:
            return
        errors: list[str] = []

        def attempt(what: str, step: Callable[[], object]) -> None:
            try:
                step()
            except Exception as error:  # noqa: BLE001 - teardown goes on; all errors reported
                errors.append(f"{what}: {error}")

        for handle in self._views:
            attempt("release_mem_view", lambda h=handle: agent.release_mem_view(h))
        self._views = []
        for name in self.remote_names.values():
            attempt(f"remove_remote_agent({name})", lambda n=name: agent.remove_remote_agent(n))
        self.remote_names = {}
        if self._reg is not None:
            attempt("deregister_memory", lambda: agent.deregister_memory(self._reg))
            self._reg = None
        if self.use_etcd:
            attempt("invalidate_local_metadata", agent.invalidate_local_metadata)
        self.agent = None
        if errors:
            raise RuntimeError("nixl transport teardown: " + "; ".join(errors))


# Settings of the nixl build, parsed from the environment by config.EnvSettings.read().
_ETCD_ENDPOINT = re.compile(r"^https?://[A-Za-z0-9_.\-\[\]:]+:\d+/?$")


def parse_etcd_endpoints(text: str | None) -> tuple[str, ...]:
    """NIXL_ETCD_ENDPOINTS: comma-separated http(s)://host:port, or unset (none)."""
    if text is None:
        return ()
    endpoints = tuple(e.strip() for e in text.split(","))
    for endpoint in endpoints:
        if not _ETCD_ENDPOINT.match(endpoint):
            raise ValueError(f"environment variable NIXL_ETCD_ENDPOINTS={text!r}: {endpoint!r} is "
                             "not http(s)://host:port")
    return endpoints


def parse_run_id(text: str | None, environ) -> str | None:
    """DEEPEP_NIXL_RUN_ID, else one made of the Slurm job and step (``environ``), else None."""
    if text is not None:
        if not re.match(r"^[A-Za-z0-9_.\-]+$", text):
            raise ValueError(f"environment variable DEEPEP_NIXL_RUN_ID={text!r}: expected "
                             "letters, digits, '.', '_' or '-'")
        return text
    job = environ.get("SLURM_JOB_ID")
    if job:
        step = environ.get("SLURM_STEP_ID")
        return f"slurm-{job}" + (f"-{step}" if step else "")
    return None

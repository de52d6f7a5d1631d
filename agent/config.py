"""The agent's configuration: what ``enrol`` stores (the server, the device's uid and key) and
how this run of the agent behaves (its data plane, its emulated slowness), in one frozen object.

The enrolment file holds a secret, so it is written with mode 0600 and refused if others can
read it. Its default place is ``$EDGEPIPE_AGENT_STATE/agent.json`` when that variable is set
(the containers of docker-compose.yml), else ``~/.config/edgepipe/agent.json``.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from orchestrator.protocol import DeviceResource, ProtocolError, resources_reader


class ConfigError(ValueError):
    """A configuration that cannot be used, naming the file and the problem."""


def default_path() -> Path:
    state = os.environ.get("EDGEPIPE_AGENT_STATE")
    if state:
        return Path(state) / "agent.json"
    return Path.home() / ".config" / "edgepipe" / "agent.json"


@dataclass(frozen=True)
class Enrolment:
    server: str
    uid: str
    key: str
    name: str

    @property
    def authorization(self) -> str:
        return f"Device {self.uid}:{self.key}"

    def to_json(self) -> dict[str, str]:
        return {"server": self.server, "uid": self.uid, "key": self.key, "name": self.name}


def normalise_server(url: str) -> str:
    """``http(s)://host[:port]`` without a trailing slash; raises ConfigError otherwise."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"server must be an http:// or https:// URL, got {url!r}")
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def local_address_towards(server: str) -> str:
    """The address of this machine's interface that reaches ``server``: where neighbours on
    the same network can reach this agent's data plane. No packet is sent (a UDP socket's
    connect only picks the route); loopback for a server on this machine."""
    host = urlsplit(server).hostname or "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))
            address = probe.getsockname()[0]
    except OSError as exc:
        raise ConfigError(f"cannot find this machine's address towards {host} ({exc}); pass "
                          "--data-host with the address neighbours reach this device at") from None
    return str(address)


def websocket_url(server: str) -> str:
    parts = urlsplit(server)
    scheme = "wss" if parts.scheme == "https" else "ws"
    return urlunsplit((scheme, parts.netloc, f"{parts.path.rstrip('/')}/ws/agent/", "", ""))


def save_enrolment(path: Path, enrolment: Enrolment) -> None:
    """Write the enrolment readable by its owner only (the key is a secret)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(enrolment.to_json(), handle, indent=1)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def load_enrolment(path: Path) -> Enrolment:
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ConfigError(f"{path}: no enrolment here; run `python -m agent enrol --server URL "
                          "--token TOKEN` first") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{path}: holds the device key but others can read it "
                          f"(mode {stat.S_IMODE(mode):o}); chmod 600 it")
    try:
        raw: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read as JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: must be a JSON object")
    missing = [k for k in ("server", "uid", "key", "name") if not isinstance(raw.get(k), str)]
    if missing:
        raise ConfigError(f"{path}: {missing[0]} is missing or not a string")
    return Enrolment(server=normalise_server(raw["server"]), uid=raw["uid"], key=raw["key"],
                     name=raw["name"])


def parse_resources(text: str) -> tuple[DeviceResource, ...]:
    """``--resources``: ``kind=speed:backward_speed`` (or ``kind=speed``, the same speed both
    ways), comma-separated, e.g. ``cpu=1:0.5,gpu=2:4``: the device's compute resources, each
    one's forward and backward speed relative to the others'. 1 to 8 resources, positive
    finite speeds, each kind once, a short identifier; ConfigError naming what is wrong."""
    raw = []
    for i, item in enumerate(text.split(",")):
        kind, sep, speeds = item.strip().partition("=")
        forward, _, backward = speeds.partition(":")
        try:
            speed = float(forward)
            backward_speed = float(backward) if backward else speed
        except ValueError:
            sep = ""
        if not sep:
            raise ConfigError(f"--resources: {item.strip()!r} (resource {i}) is not "
                              "kind=speed:backward_speed, e.g. cpu=1:0.5,gpu=2:4")
        raw.append({"kind": kind, "speed": speed, "backward_speed": backward_speed})
    try:
        resources: tuple[DeviceResource, ...] = resources_reader(raw, "resources")
    except ProtocolError as exc:
        raise ConfigError(f"--resources: {exc}") from None
    return resources


@dataclass(frozen=True)
class AgentConfig:
    """How this agent process runs."""

    enrolment: Enrolment
    data_host: str = "127.0.0.1"  # the address neighbours reach this agent's data plane at
    data_port: int = 0  # 0: any free port
    slowdown: float = 1.0  # compute this many times slower (emulation)
    bandwidth_bps: float | None = None  # shape what this agent sends (emulation)
    latency_s: float = 0.0
    threads: int | None = None  # torch threads (None: torch's default)
    # where this machine's warm per-layer times are kept between runs of the agent (None: in
    # memory only), so that an emulated device paces by the times its profile was taken with
    warm_times_path: Path | None = None
    # where the data plane's CURVE key pair is kept (agent.security; None: a new pair each
    # start, which the server learns at hello like any other)
    data_keys_dir: Path | None = None
    # emulated compute resources (--resources), reported in hello; () reports none: the
    # server plans the device as one resource at its measured speed
    resources: tuple[DeviceResource, ...] = ()
    # the one directory the server's ``npz:PATH`` data sets may be read from (--data-dir,
    # EDGEPIPE_DATA_DIR; agent.data.npz_path); None: the agent reads no npz data set
    data_dir: Path | None = None
    heartbeat_s: float = 2.0
    flush_s: float = 0.1  # how often events go to the server (about 10 batches a second)
    max_backoff_s: float = 30.0

    def __post_init__(self) -> None:
        if self.slowdown < 1:
            raise ConfigError(f"--slowdown must be at least 1, got {self.slowdown}")
        if self.bandwidth_bps is not None and self.bandwidth_bps <= 0:
            raise ConfigError(f"--bandwidth-mbps must be positive, got {self.bandwidth_bps}")
        if self.latency_s < 0:
            raise ConfigError(f"--latency-ms must not be negative, got {self.latency_s}")
        if not 0 <= self.data_port < 65536:
            raise ConfigError(f"--data-port must be a port number, got {self.data_port}")
        if self.data_dir is not None and not Path(self.data_dir).is_dir():
            raise ConfigError(f"--data-dir {self.data_dir}: no such directory")

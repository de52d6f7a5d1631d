"""``python -m agent`` (or ``edgepipe-agent``): the device agent's command line.

    enrol    enrol this device with a server (once): stores its uid and key, mode 0600
    run      connect to the server and train what it deploys here, until Ctrl-C or SIGTERM
    profile  profile a zoo model layer by layer on this device and print the profile JSON

Environment (for containers; flags win): EDGEPIPE_SERVER, EDGEPIPE_TOKEN (``run`` enrols first
when no enrolment is stored), EDGEPIPE_AGENT_NAME, EDGEPIPE_AGENT_STATE (the enrolment's
directory), EDGEPIPE_RESOURCES (``--resources``), EDGEPIPE_DATA_DIR (``--data-dir``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from agent.calibration import Calibration
from agent.config import (
    AgentConfig,
    ConfigError,
    Enrolment,
    default_path,
    load_enrolment,
    local_address_towards,
    normalise_server,
    parse_resources,
    save_enrolment,
)
from agent.data import DATASETS, DataError, load_dataset
from agent.zoo import MODELS, build_model

log = logging.getLogger("edgepipe.agent")

DEFAULT_BANDWIDTH_BPS = 12_500_000.0  # 100 Mbit/s until measured
SERVER_RETRY_S = 0.2  # between tries of a server still starting (run --wait-for-server)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def enrol(*, server: str, token: str, name: str, path: Path,
          bandwidth_bps: float = DEFAULT_BANDWIDTH_BPS, latency_s: float = 0.0) -> Enrolment:
    """Enrol with ``token``; the device key the server answers is stored at ``path``."""
    from agent.runtime import hardware_description

    server = normalise_server(server)
    hardware = hardware_description()
    body = {"token": token, "name": name, "hardware": hardware,
            "memory_bytes": max(1, int(hardware["memory_bytes"])),
            "bandwidth_bps": bandwidth_bps, "latency_s": latency_s}
    try:
        answer = httpx.post(f"{server}/api/agent/enrol/", json=body, timeout=30)
    except httpx.HTTPError as exc:
        raise ConfigError(f"cannot reach {server}: {exc}") from None
    if answer.status_code != 201:
        try:
            detail = answer.json().get("detail", answer.text)
        except ValueError:
            detail = answer.text[:200]
        raise ConfigError(f"{server} refused the enrolment ({answer.status_code}): {detail}")
    data = answer.json()
    enrolment = Enrolment(server=server, uid=data["uid"], key=data["key"], name=data["name"])
    save_enrolment(path, enrolment)
    return enrolment


def wait_for_server(server: str, *, wait_s: float) -> bool:
    """Wait up to ``wait_s`` for ``server`` to accept connections (one starting beside this
    agent), trying every SERVER_RETRY_S; whether it does. A connection refused would
    otherwise fail an enrolment, or put off the first connect by the session's backoff."""
    parts = urlsplit(server)
    address = (parts.hostname or "127.0.0.1",
               parts.port or (443 if parts.scheme == "https" else 80))
    deadline = time.monotonic() + wait_s
    while True:
        try:
            socket.create_connection(address, timeout=SERVER_RETRY_S).close()
            return True
        except OSError:
            if time.monotonic() + SERVER_RETRY_S > deadline:
                return False
            time.sleep(SERVER_RETRY_S)


def _cmd_enrol(args: argparse.Namespace) -> int:
    server = args.server or os.environ.get("EDGEPIPE_SERVER")
    token = args.token or os.environ.get("EDGEPIPE_TOKEN")
    if not server or not token:
        raise ConfigError("enrol needs --server and --token (or EDGEPIPE_SERVER and "
                          "EDGEPIPE_TOKEN)")
    enrolment = enrol(server=server, token=token, name=_name(args), path=args.config)
    print(f"enrolled as {enrolment.name} ({enrolment.uid}) with {enrolment.server}; "
          f"key stored in {args.config}")
    return 0


def _name(args: argparse.Namespace) -> str:
    return str(args.name or os.environ.get("EDGEPIPE_AGENT_NAME") or socket.gethostname())


def _cmd_run(args: argparse.Namespace) -> int:
    token = args.token or os.environ.get("EDGEPIPE_TOKEN")
    if not args.config.exists() and not token:
        load_enrolment(args.config)  # raises, saying how to enrol
    # the probe of this device's fixed costs (torch's import first) runs while this thread
    # enrols and the server starts; it keeps its result beside the enrolment for a restart
    calibration = Calibration(
        path=args.config.with_name(f"{args.config.stem}.fixed-costs.json"),
        slowdown=args.slowdown, threads=args.threads)
    server = args.server or os.environ.get("EDGEPIPE_SERVER")
    if args.wait_for_server > 0 and (server or args.config.exists()):
        wait_for_server(normalise_server(server or load_enrolment(args.config).server),
                        wait_s=args.wait_for_server)
    if not args.config.exists():
        _cmd_enrol(args)
    enrolment = load_enrolment(args.config)
    measured = calibration.result()  # before the runtime's threads start: it measures alone
    from agent.runtime import AgentRuntime

    if server and normalise_server(server) != enrolment.server:
        # the server moved (another address or port): the device and its key stay the same
        log.info("using %s instead of the enrolment's %s", server, enrolment.server)
        enrolment = Enrolment(server=normalise_server(server), uid=enrolment.uid,
                              key=enrolment.key, name=enrolment.name)
    config = AgentConfig(
        enrolment=enrolment,
        data_host=args.data_host or local_address_towards(enrolment.server),
        data_port=args.data_port,
        slowdown=args.slowdown,
        bandwidth_bps=None if args.bandwidth_mbps is None else args.bandwidth_mbps * 1e6 / 8,
        latency_s=args.latency_ms / 1e3, threads=args.threads,
        resources=parse_resources(args.resources) if args.resources else (),
        data_dir=args.data_dir,
        warm_times_path=args.config.with_name(f"{args.config.stem}.warm-times.json"),
        data_keys_dir=args.config.with_name(f"{args.config.stem}.data-keys"))
    stop = threading.Event()
    runtime = AgentRuntime(config, stop=stop)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("agent %s (%s): data plane at %s, slowdown %gx%s", enrolment.name, enrolment.uid,
             runtime.advertised_address, config.slowdown, "".join(
                 f", {r.kind} {r.speed:g}:{r.backward_speed:g}" for r in config.resources))
    runtime.calibrate(measured)
    try:
        asyncio.run(runtime.serve())
    finally:
        runtime.close()
    log.info("agent stopped")
    return 0


def _cmd_profile(args: argparse.Namespace) -> int:
    from agent.profiler import profile_model

    data = load_dataset(args.dataset, data_dir=args.data_dir)
    model = build_model(args.model, input_shape=data.input_shape, num_classes=data.num_classes)
    profile = profile_model(model, batch_size=args.batch_size, reference=socket.gethostname(),
                            dataset=args.dataset, repeats=args.repeats, slowdown=args.slowdown,
                            progress=True)
    text = json.dumps(profile.to_json(), indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
        print(f"profile of {args.model} written to {args.out}", file=sys.stderr)
    else:
        print(text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m agent", description=__doc__.split("\n\n")[0],
                                     epilog="Run `python -m agent COMMAND --help` for a command's "
                                            "options.")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def config_option(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", type=Path, default=default_path(),
                       help=f"where the enrolment is kept (default {default_path()})")

    def data_dir_option(p: argparse.ArgumentParser) -> None:
        default = os.environ.get("EDGEPIPE_DATA_DIR") or None
        p.add_argument("--data-dir", type=Path, default=None if default is None else Path(default),
                       metavar="DIR",
                       help="the one directory npz:PATH data sets are read from (a relative PATH "
                            "inside it; nothing outside it, symbolic links included); without "
                            "it npz data sets are refused (default: $EDGEPIPE_DATA_DIR)")

    enrol_parser = sub.add_parser("enrol", help="enrol this device with a server (once)",
                                  description="Enrol this device with an EdgePipe server using "
                                              "an enrolment token from its Devices page.")
    enrol_parser.add_argument("--server", help="the server's URL, e.g. http://10.0.0.2:8000")
    enrol_parser.add_argument("--token", help="the enrolment token")
    enrol_parser.add_argument("--name", help="this device's name (default: the host name)")
    config_option(enrol_parser)
    enrol_parser.set_defaults(handler=_cmd_enrol)

    run_parser = sub.add_parser(
        "run", help="connect to the server and train what it deploys here",
        description="Connect to the server, heartbeat, and profile and train whatever it asks "
                    "of this device, until Ctrl-C or SIGTERM. The emulation flags make one "
                    "machine host a heterogeneous testbed.")
    config_option(run_parser)
    run_parser.add_argument("--server", help="the server to connect to (default: the one it "
                                             "enrolled with); with --token, enrol first if no "
                                             "enrolment is stored")
    run_parser.add_argument("--token", help="enrolment token for a first start")
    run_parser.add_argument("--wait-for-server", type=float, default=0.0, metavar="SECONDS",
                            help="wait up to this long for a server that does not accept "
                                 "connections yet (one starting beside this agent) before "
                                 "enrolling or connecting (default 0: do not wait)")
    run_parser.add_argument("--name", help="device name for a first start")
    run_parser.add_argument("--data-host", default=os.environ.get("EDGEPIPE_DATA_HOST"),
                            help="the address neighbours reach this device's data plane at "
                                 "(default: this machine's address on the route to the "
                                 "server, 127.0.0.1 for a server on this machine)")
    run_parser.add_argument("--data-port", type=int, default=0,
                            help="data-plane port (default: any free port)")
    run_parser.add_argument("--slowdown", type=float, default=1.0, metavar="X",
                            help="emulate a device X times slower (compute)")
    run_parser.add_argument("--bandwidth-mbps", type=_positive_float, metavar="M",
                            help="emulate a link of M Mbit/s for what this device sends")
    run_parser.add_argument("--latency-ms", type=float, default=0.0, metavar="L",
                            help="emulate L ms of latency on what this device sends")
    run_parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    run_parser.add_argument(
        "--resources", default=os.environ.get("EDGEPIPE_RESOURCES"),
        metavar="KIND=F:B,...",
        help="emulate a device of several compute resources, e.g. cpu=1:0.5,gpu=2:4: each "
             "one's forward (F) and backward (B) speed, relative to the others'. Reported to "
             "the server, whose Duan-Wu planner may then split forward and backward work "
             "between them (two lanes); the device's measured speed is shared out by F")
    data_dir_option(run_parser)
    run_parser.set_defaults(handler=_cmd_run)

    profile_parser = sub.add_parser(
        "profile", help="profile a model layer by layer on this device",
        description="Time every cuttable layer of a zoo model on this device (forward and "
                    "backward, median of repeats) and print the model profile JSON.")
    profile_parser.add_argument("--model", required=True, choices=MODELS)
    profile_parser.add_argument("--dataset", default="digits",
                                help=f"{', '.join(DATASETS)} or npz:PATH (default digits)")
    profile_parser.add_argument("--batch-size", type=int, default=32)
    profile_parser.add_argument("--repeats", type=int, default=5)
    profile_parser.add_argument("--slowdown", type=float, default=1.0, metavar="X")
    profile_parser.add_argument("--out", help="write the profile here instead of stdout")
    data_dir_option(profile_parser)
    profile_parser.set_defaults(handler=_cmd_profile)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        code: int = args.handler(args)
    except (ConfigError, DataError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return code

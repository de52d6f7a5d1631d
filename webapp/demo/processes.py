"""Child processes the demo starts (the web server, a Celery worker, device agents): started in
their own process groups with their output in log files, watched, and stopped in order."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Child:
    name: str
    command: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    killed: bool = False  # on purpose (ProcessGroup.kill): its exit is expected


@dataclass
class ProcessGroup:
    log_dir: Path
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    children: dict[str, Child] = field(default_factory=dict)

    def start(self, name: str, command: list[str], *, nice: int = 0) -> Child:
        """Start ``command`` as ``name``; ``nice`` > 0 lowers its CPU priority by that much
        (the child is just past its exec, before its interpreter starts any thread: every
        thread it starts inherits it)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        child = Child(name=name, command=command, log_path=self.log_dir / f"{name}.log")
        with child.log_path.open("ab") as log:
            child.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                             env=self.env, process_group=0)
        if nice > 0:
            os.setpriority(os.PRIO_PROCESS, child.process.pid,
                           os.getpriority(os.PRIO_PROCESS, 0) + nice)
        self.children[name] = child
        return child

    def exited(self, *, among: Callable[[str], bool] = lambda name: True) -> Child | None:
        """A child that stopped on its own (not one killed on purpose), if any; only those
        whose name ``among`` accepts."""
        return next((c for c in self.children.values()
                     if among(c.name) and not c.killed and c.process is not None
                     and c.process.poll() is not None), None)

    def running(self, name: str) -> bool:
        child = self.children.get(name)
        return child is not None and child.process is not None and child.process.poll() is None

    def kill(self, name: str) -> None:
        """Kill a child at once (SIGKILL, its whole process group), as a device that loses
        power; it is marked killed first, so that its exit is expected (``exited`` skips
        it)."""
        child = self.children[name]
        child.killed = True
        if child.process is not None and child.process.poll() is None:
            os.killpg(child.process.pid, signal.SIGKILL)
            child.process.wait()

    def stop_all(self, *, grace_s: float = 15.0) -> None:
        """SIGTERM everyone (agents first, the web server last), then SIGKILL stragglers."""
        order = sorted(self.children.values(), key=lambda c: c.name in ("web", "worker"))
        for child in order:
            if child.process is not None and child.process.poll() is None:
                os.killpg(child.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in order:
            if child.process is None:
                continue
            try:
                child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(child.process.pid, signal.SIGKILL)
                child.process.wait()

    def tail(self, name: str, lines: int = 20) -> str:
        path = self.children[name].log_path
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

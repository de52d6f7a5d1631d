"""The dependency rule: the agent imports neither Django nor the web app, and needs nothing
beyond requirements-agent.txt."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT
from tests.orchestrator.test_imports import imported_modules

ALLOWED = {"torch", "numpy", "sklearn", "zmq", "websockets", "httpx", "tqdm", "safetensors",
           "psutil", "agent", "orchestrator"}


def test_agent_imports_only_its_own_requirements() -> None:
    stdlib = set(sys.stdlib_module_names)
    for path in sorted((ROOT / "agent").rglob("*.py")):
        outside = {m for m in imported_modules(path) if m not in stdlib and m != "__future__"}
        assert outside <= ALLOWED, (path, outside - ALLOWED)


def test_importing_the_agent_pulls_in_no_django() -> None:
    code = ("import importlib, pkgutil, sys, agent\n"
            "for m in pkgutil.walk_packages(agent.__path__, 'agent.'):\n"
            "    if not m.name.endswith('__main__'):\n"
            "        importlib.import_module(m.name)\n"
            "print(','.join(n for n in ('django', 'webapp', 'celery', 'channels') "
            "if n in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""

"""The dependency rule: orchestrator imports neither Django nor webapp nor agent, torch only in
the learned planner (TAPP) and plotly only in the run report's figures and document (devices
running the agent install neither)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

TORCH_ALLOWED = {"tapp.py", "tapp_policy.py"}
PLOTLY_ALLOWED = {"report/figures.py", "report/document.py"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_orchestrator_sources_import_nothing_forbidden() -> None:
    files = sorted((ROOT / "orchestrator").rglob("*.py"))
    assert len(files) > 10
    for path in files:
        names = imported_modules(path)
        forbidden = {"django", "webapp", "agent", "channels", "celery", "rest_framework"}
        assert not names & forbidden, path
        if path.name not in TORCH_ALLOWED:
            assert "torch" not in names, path
        if path.relative_to(ROOT / "orchestrator").as_posix() not in PLOTLY_ALLOWED:
            assert "plotly" not in names, path


def test_importing_everything_pulls_in_no_django_or_torch() -> None:
    code = (
        "import importlib, pkgutil, sys, orchestrator\n"
        "for m in pkgutil.walk_packages(orchestrator.__path__, 'orchestrator.'):\n"
        "    if m.name.split('.')[-1] not in ('__main__', 'tapp', 'tapp_policy'):\n"
        "        importlib.import_module(m.name)\n"
        "bad = [n for n in ('django', 'torch', 'webapp', 'agent') if n in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_the_command_line_and_the_formats_need_no_plotly() -> None:
    code = ("import sys, orchestrator.cli, orchestrator.formats, orchestrator.events\n"
            "orchestrator.cli.build_parser()\n"
            "print('plotly' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"

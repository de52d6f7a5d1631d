"""Where an agent reads ``npz:PATH`` data sets from: only inside the directory its --data-dir
(EDGEPIPE_DATA_DIR, AgentConfig.data_dir) names, whatever path the server sends; a path outside
it is refused with the same message whether or not the file exists; without the setting npz
data sets are refused. The built-in data sets need no setting."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from agent.cli import build_parser
from agent.config import AgentConfig, ConfigError, Enrolment
from agent.data import DataError, load_dataset
from agent.runtime import AgentRuntime

ENROLMENT = Enrolment(server="http://127.0.0.1:1", uid="edge-abc123", key="dk_secret",
                      name="edge")
REFUSED = "no such file in this agent's data directory (--data-dir)"


def npz(path: Path, classes: int = 3) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=np.random.rand(30, 8, 8).astype(np.float32), y=np.arange(30) % classes)
    return path


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """A data directory with a data set in it and a sub-directory, and a secret data set
    outside it."""
    data = tmp_path / "data"
    npz(data / "good.npz")
    npz(data / "sub" / "nested.npz", classes=4)
    secret = npz(tmp_path / "elsewhere" / "secret.npz")
    return data, secret


def refusal(spec: str, data_dir: Path | None) -> str:
    with pytest.raises(DataError) as refused:
        load_dataset(spec, data_dir=data_dir)
    return str(refused.value)


def test_paths_inside_the_data_directory_are_read(layout: tuple[Path, Path]) -> None:
    data, _ = layout
    assert load_dataset("npz:good.npz", data_dir=data).num_classes == 3
    assert load_dataset("npz:sub/nested.npz", data_dir=data).num_classes == 4
    assert load_dataset(f"npz:{data / 'good.npz'}", data_dir=data).num_classes == 3
    assert load_dataset("npz:sub/../good.npz", data_dir=data).num_classes == 3  # stays inside
    # the directory named by a relative path, as the agent was started
    cwd = os.getcwd()
    os.chdir(data.parent)
    try:
        assert load_dataset("npz:good.npz", data_dir=Path("data")).num_classes == 3
    finally:
        os.chdir(cwd)


def test_a_path_outside_is_refused_alike_whether_or_not_the_file_exists(
        layout: tuple[Path, Path]) -> None:
    data, secret = layout
    existing = [f"npz:{secret}", "npz:../elsewhere/secret.npz",
                "npz:sub/../../elsewhere/secret.npz"]
    missing = [f"npz:{secret.with_name('none.npz')}", "npz:../elsewhere/none.npz", "npz:none.npz"]
    for spec in existing + missing:
        message = refusal(spec, data)
        assert message == f"{spec}: {REFUSED}; npz paths are read from there only", spec
        assert str(secret.parent) not in message.replace(spec, "")
    for spec in ("npz:", "npz:sub", "npz:.", "npz:/etc/passwd", "npz:bad\0name.npz"):
        assert REFUSED in refusal(spec, data), spec


def test_a_symbolic_link_out_of_the_directory_is_refused(layout: tuple[Path, Path]) -> None:
    data, secret = layout
    (data / "link.npz").symlink_to(secret)
    (data / "dangling.npz").symlink_to(secret.with_name("none.npz"))
    (data / "outdir").symlink_to(secret.parent, target_is_directory=True)
    (data / "loop.npz").symlink_to(data / "loop.npz")
    for spec in ("npz:link.npz", "npz:dangling.npz", "npz:outdir/secret.npz", "npz:loop.npz"):
        assert refusal(spec, data) == f"{spec}: {REFUSED}; npz paths are read from there only"
    # a link that stays inside is followed
    (data / "alias.npz").symlink_to(data / "good.npz")
    assert load_dataset("npz:alias.npz", data_dir=data).num_classes == 3


def test_without_a_data_directory_npz_data_sets_are_refused(layout: tuple[Path, Path]) -> None:
    data, _ = layout
    for spec in (f"npz:{data / 'good.npz'}", "npz:good.npz", "npz:/no/such.npz"):
        message = refusal(spec, None)
        assert message.startswith(f"{spec}: this agent reads no npz data sets; pass --data-dir")


def test_the_built_in_data_sets_need_no_data_directory(tmp_path: Path) -> None:
    assert load_dataset("digits").input_shape == (1, 8, 8)
    assert load_dataset("synthetic-cifar", seed=1).input_shape == (3, 32, 32)
    assert load_dataset("digits", data_dir=tmp_path).num_classes == 10


def test_the_setting_comes_from_the_flag_or_the_environment(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("EDGEPIPE_DATA_DIR", raising=False)
    assert build_parser().parse_args(["run"]).data_dir is None
    assert build_parser().parse_args(["profile", "--model", "mlp"]).data_dir is None
    assert build_parser().parse_args(["run", "--data-dir", str(tmp_path)]).data_dir == tmp_path
    monkeypatch.setenv("EDGEPIPE_DATA_DIR", str(tmp_path / "env"))
    assert build_parser().parse_args(["run"]).data_dir == tmp_path / "env"
    assert build_parser().parse_args(["profile", "--model", "mlp"]).data_dir == tmp_path / "env"
    flag = build_parser().parse_args(["run", "--data-dir", str(tmp_path)])
    assert flag.data_dir == tmp_path  # the flag wins
    assert AgentConfig(enrolment=ENROLMENT, data_dir=tmp_path).data_dir == tmp_path
    with pytest.raises(ConfigError, match=r"--data-dir .*: no such directory"):
        AgentConfig(enrolment=ENROLMENT, data_dir=tmp_path / "missing")


def test_the_agent_loads_what_the_server_names_from_its_data_directory(
        layout: tuple[Path, Path]) -> None:
    data, secret = layout
    confined = AgentRuntime(AgentConfig(enrolment=ENROLMENT, data_dir=data),
                            stop=threading.Event())
    plain = AgentRuntime(AgentConfig(enrolment=ENROLMENT), stop=threading.Event())
    try:
        assert confined.dataset("npz:good.npz").num_classes == 3
        assert confined.dataset("digits").num_classes == 10
        with pytest.raises(DataError, match="no such file in this agent's data directory"):
            confined.dataset(f"npz:{secret}")
        with pytest.raises(DataError, match="pass --data-dir"):
            plain.dataset(f"npz:{data / 'good.npz'}")
        assert plain.dataset("digits").num_classes == 10
        # a profile command naming a file elsewhere is refused, saying the same
        ack = confined.handle_command({"type": "command", "id": "c1", "command": "profile",
                                       "model": "mlp", "dataset": f"npz:{secret}",
                                       "batch_size": 8}).to_json()
        assert ack["ok"] is False and REFUSED in ack["error"], ack
    finally:
        confined.close()
        plain.close()

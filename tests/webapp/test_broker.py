"""The embedded broker writes each message whole before a worker can see it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from webapp import broker


def test_a_message_is_visible_to_a_queue_only_once_written_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # kombu's own transport created the file under its queue name and then wrote it: a worker
    # took it in between, read nothing, and stopped on a JSONDecodeError
    seen: list[list[str]] = []
    replace = os.replace

    def watching(src: Any, dst: Any) -> None:
        seen.append(sorted(os.listdir(queued)))
        assert Path(src).read_bytes().startswith(b"{")  # whole before it is named
        replace(src, dst)

    monkeypatch.setattr(broker.os, "replace", watching)
    queued = tmp_path / "queue"
    queued.mkdir()
    with Connection("filesystem://localhost//", transport=broker.Transport, transport_options={
            "data_folder_in": str(queued), "data_folder_out": str(queued),
            "control_folder": str(tmp_path / "control"),
            "store_processed": False}) as connection:
        queue = connection.SimpleQueue("plans")
        queue.put({"run": 7})
        assert seen and not any(name.endswith(".msg") for name in seen[0])
        assert [n.endswith(".plans.msg") for n in os.listdir(queued)] == [True]
        message = queue.get(timeout=5)
        assert message.payload == {"run": 7}
        message.ack()
        queue.close()
    assert os.listdir(queued) == []

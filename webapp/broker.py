"""The embedded topology's Celery broker: kombu's filesystem transport, with each message
written under a temporary name and renamed into the queue folder once complete.

kombu writes a message file in place (create it, then write it), and a worker polling the folder
can take the file between the two: it read an empty file and stopped with a JSONDecodeError
(kombu issue 1551), which failed a CI run. A rename within one folder is atomic, and the
temporary name (``.partial-<uuid>``) is none a queue reads (``<time>_<uuid>.<queue>.msg``)."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        """Put ``payload`` onto ``queue``: visible under its queue's name only when whole."""
        folder = self.data_folder_out
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        partial = os.path.join(folder, f".partial-{uuid.uuid4()}")
        try:
            with open(partial, "wb") as f:
                f.write(dumps(payload).encode())
            os.replace(partial, os.path.join(folder, name))
        except OSError as exc:
            raise ChannelError(f"Cannot add file {name!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel

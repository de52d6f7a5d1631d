"""bench/faults.py's CPU sampler: the cores each of the testbed's processes used, and the time
its threads waited for one, read for a window of a run after the run (and its threads) ended."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

from bench.cpu_sampler import CpuSampler, agents_waiting

# 1.2 s of its own CPU time (longer than the sampler's interval), however long a loaded
# machine makes that take (a wall second of spinning got under 0.3 s of a core on a loaded
# machine, and the test failed)
BUSY_FOR_A_CPU_SECOND = """
import threading, time
def spin():
    while time.thread_time() < 1.2:
        pass
thread = threading.Thread(target=spin)
thread.start()
thread.join()
print("spun", flush=True)
time.sleep(60)
"""


def test_the_sampler_counts_a_thread_that_exited_before_its_window_is_read() -> None:
    # Prepare: an "agent" whose one busy thread spins for 1.2 s of CPU and ends, and
    # an idle "web"
    children = {name: SimpleNamespace(process=subprocess.Popen(
                    [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True))
                for name, code in (("agent-busy", BUSY_FOR_A_CPU_SECOND),
                                   ("web", "import time; time.sleep(60)"))}
    testbed = SimpleNamespace(processes=SimpleNamespace(children=children))
    try:
        # Execute: sample until the busy thread has spun and ended (a fixed 4 s was not
        # enough on a loaded machine), and a little after; read the window afterwards
        with CpuSampler(testbed) as sampler:
            start = time.time()
            busy = children["agent-busy"].process
            assert busy.stdout is not None and busy.stdout.readline().strip() == "spun"
            time.sleep(1.0)  # past the sampler's next read, with the thread gone
            end = time.time()
        window = sampler.window(start, end)
    finally:
        for child in children.values():
            child.process.kill()
            child.process.wait()

    # Assert: the spinning second is there although its thread was gone before the window ended
    # (a read at the end alone would have lost it); agents are named without their prefix
    assert set(window) == {"busy", "web"}
    assert window["busy"]["cores"] * (end - start) > 0.6, window  # it spun 1.2 s of CPU
    assert window["web"]["cores"] < window["busy"]["cores"] / 4, window
    assert agents_waiting(window) == window["busy"]["waiting"]
    assert sampler.window(end + 10, end + 20) == {}

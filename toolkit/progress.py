"""What a slow step is doing, said on stderr while it runs: any step of a command that can take more than a couple
of seconds (loading a program's own parser, aws-parallelcluster's validators) is wrapped in `step(...)`.

A step that ends within SLOW_S prints nothing, so quick commands stay quiet; one that runs longer says what it is
doing when SLOW_S has passed, and how long it took when it ends. stderr only: stdout stays one JSON envelope
under --json.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator, TextIO

SLOW_S = 2.0  # the "any step over ~2 s"


@contextmanager
def step(what: str, *, after_s: float | None = None, stream: TextIO | None = None) -> Iterator[None]:
    """Run the body; if it is still running after `after_s` (default SLOW_S), say `what ...`, and when it ends
    `what: N.N s`."""
    started = time.monotonic()
    lock = threading.Lock()
    state = {"said": False, "done": False}
    # bound now: the body may redirect sys.stderr (toolkit.job.argcheck.quiet() around a program's noisy imports)
    out = stream if stream is not None else sys.stderr

    def say(text: str) -> None:
        out.write(text + "\n")
        out.flush()

    def announce() -> None:
        with lock:  # never after the body ended: the timer may fire while the body returns
            if not state["done"]:
                state["said"] = True
                say(f"{what} ...")

    delay = SLOW_S if after_s is None else after_s
    timer = threading.Timer(delay, announce)
    timer.daemon = True
    if delay <= 0:  # every step is to be said (a test; a user who wants every step): said before it runs
        announce()
    else:
        timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            state["done"] = True
            if state["said"]:
                say(f"{what}: {time.monotonic() - started:.1f} s")

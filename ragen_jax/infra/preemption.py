"""SIGTERM and SIGINT as a request to stop cleanly: finish the current iteration, save a checkpoint, exit 75.

A preempted TPU VM or cloud GPU gets SIGTERM and some 30 s before it is killed. The handler only
records the signal (`STOP.signal`); the training loops look at it between iterations
(`STOP.agreed()`), save a checkpoint there and end with `PREEMPTED_EXIT`, and the same command
resumes from that checkpoint. With several processes `agreed()` is a collective at that boundary:
a signal seen by any one process stops all of them after the same iteration (each process may be
signalled at another moment, or only one of them). A second signal stops at once (`exit_now`): what
the last complete checkpoint holds is kept, as after kill -9.

The launchers install the handler first thing (`STOP.install()`; this module imports no jax, so
that is within a fraction of a second of the process starting), so a signal during start-up or
compilation also ends the run with exit 75 at the first boundary; the trainers install it for the
duration of `train()` when used as a library (`with STOP.installed():`, main thread only).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

# The exit status of a run stopped by SIGTERM / SIGINT after saving its checkpoint: BSD's EX_TEMPFAIL
# ("temporary failure, retry"), so a scheduler can tell "requeue me" from a failure (1) or bad input (2).
PREEMPTED_EXIT = 75
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """The process's record of a stop signal (`signal`: its name, None until one arrives)."""

    def __init__(self):
        self.signal: str | None = None
        self._previous: dict = {}

    def install(self) -> bool:
        """Handle SIGTERM and SIGINT from now on; False (nothing done) outside the main thread, where
        Python cannot set handlers."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for sig in SIGNALS:
            if sig not in self._previous:
                self._previous[sig] = signal.signal(sig, self._handle)
        return True

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    @contextlib.contextmanager
    def installed(self):
        """The handlers for the duration of a `with` block, unless installed already (by a launcher)."""
        mine = not self._previous and self.install()
        try:
            yield self
        finally:
            if mine:
                self.uninstall()

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signal is not None:
            from ragen_jax.infra.distributed import exit_now  # jax: imported when needed (module stays light)

            print(f"{name} again: stopping now; the run resumes from its last complete checkpoint",
                  file=sys.stderr, flush=True)
            exit_now(128 + signum)
        self.signal = name
        print(f"{name} received: finishing the current iteration, then saving a checkpoint and stopping (exit "
              f"{PREEMPTED_EXIT}); the same command resumes. Send it again to stop at once.", file=sys.stderr, flush=True)

    def agreed(self) -> bool:
        """Whether any process has been asked to stop. Every process must call it at the same point."""
        from ragen_jax.infra.distributed import any_process  # jax: imported when needed (module stays light)

        return any_process(self.signal is not None)

    def reset(self) -> None:
        """Forget a handled request (a library caller running another job in the same process)."""
        self.signal = None


STOP = StopRequest()  # signal handlers belong to the process: one request per process

__all__ = ["PREEMPTED_EXIT", "SIGNALS", "STOP", "StopRequest"]

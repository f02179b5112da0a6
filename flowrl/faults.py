"""Fault injection for the crash tests: named points in the loop (and in `flowrl sample`) where a test can kill the
process as a crash or the OOM killer would, to check that what it left on disk resumes exactly."""

from __future__ import annotations

import os
import signal

KILL_AT = "FLOWRL_KILL_AT"  # the environment variable naming the point: PHASE@N


def fault_point(phase: str, update: int) -> None:
    """Kill this process with SIGKILL here when FLOWRL_KILL_AT is `phase@update`; otherwise do nothing.

    Args:
        phase: the point's name: `rollout` (an update's batch sampled and scored), `update` (before an optimizer
            step), `checkpoint` (a checkpoint's files written, its state.json not yet) or `sample` (after
            `flowrl sample` wrote a batch).
        update: the update number (for `sample`: how many batches were written).
    """
    if os.environ.get(KILL_AT) == f"{phase}@{update}":
        os.kill(os.getpid(), signal.SIGKILL)

"""Process groups as the tests look at them."""

import os


def group_alive(pgid: int) -> bool:
    """Whether process group `pgid` exists (a group of zombies, not yet reaped, counts: stricter than
    `orchestrator.remote.procs.group_exists` where a test asserts a group is gone)."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False

"""quartet.proc on this host: a process tree reaches children that left their parent's session (as torchrun's ranks
do), and pid_alive tells a live process from a finished one."""
from __future__ import annotations

import os
import signal
import subprocess
import time

from quartet.proc import pid_alive, process_tree


def test_process_tree_includes_children_in_their_own_session():
    p = subprocess.Popen(["bash", "-c", "setsid sleep 60 & sleep 60 & wait"], start_new_session=True)
    try:
        def sessions(pids):
            try:
                return {os.getsid(x) for x in pids}
            except ProcessLookupError:
                return set()

        # both children exist once the tree has 3 processes, but the setsid child joins its own session only when
        # its setsid() has run (a loaded host can sample the tree before): wait for that too
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            tree = process_tree(p.pid)
            if len(tree) == 3 and len(sessions(tree)) == 2:
                break
            time.sleep(0.05)
        tree = process_tree(p.pid)
        assert tree[0] == p.pid and len(tree) == 3 and all(pid_alive(x) for x in tree)
        assert len({os.getsid(x) for x in tree}) == 2  # one child left the session: a process group kill misses it
        assert process_tree(os.getpid())[0] == os.getpid() and p.pid in process_tree(os.getpid())
    finally:
        for pid in process_tree(p.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait()
    deadline = time.monotonic() + 120
    while any(pid_alive(x) for x in tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(x) for x in tree)

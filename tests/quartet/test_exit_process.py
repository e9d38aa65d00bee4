"""quartet.distributed.exit_process: how a process that ran a torch.distributed group ends (the console script
``quartet`` takes that way after ``quartet train``), and that it keeps what a normal exit keeps."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import atexit, sys, threading
    from pathlib import Path
    import torch.distributed as dist
    from quartet import distributed as qd

    marker = Path(sys.argv[1])
    assert not qd.group_created()
    info = qd.setup("cpu", single_group=True)  # a one-rank Gloo group, as FSDP on one process
    assert info.initialized_here and qd.group_created()
    dist.all_reduce(__import__("torch").ones(3))
    qd.teardown(info)
    def late_writer():  # a non-daemon thread still working: a normal exit waits for it, and so must this one
        import time
        time.sleep(0.5)
        marker.with_suffix(".thread").write_text("thread finished")
    threading.Thread(target=late_writer).start()
    atexit.register(lambda: marker.write_text("atexit ran after " + marker.with_suffix(".thread").read_text()))
    sys.stdout.write("unflushed line without newline")  # buffered: exit_process must flush it
    qd.exit_process(3)
    raise SystemExit("not reached")
""")


def test_exit_process_runs_exit_handlers_flushes_and_keeps_the_code(tmp_path):
    marker = tmp_path / "marker"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(marker)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 3, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stdout == "unflushed line without newline"
    assert marker.read_text() == "atexit ran after thread finished"  # threads joined first, then atexit
    assert "not reached" not in res.stderr


def test_the_console_script_ends_through_entry():
    """pyproject's console script is cli.entry (which takes exit_process after a group), not cli.main."""
    text = (REPO / "pyproject.toml").read_text()
    assert 'quartet = "quartet.cli:entry"' in text
    # a command that creates no group ends through sys.exit with main's code
    res = subprocess.run([sys.executable, "-m", "quartet.cli", "nope"], cwd=REPO, capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 2 and "unknown command" in res.stderr


ENTRY = textwrap.dedent("""
    import sys
    import quartet.cli as cli

    class Finalized:  # a module global: its __del__ runs in the interpreter's teardown, which exit_process skips
        def __del__(self):
            sys.stdout.write("teardown ran")
            sys.stdout.flush()

    def main():
        if sys.argv[1] == "group":
            from quartet import distributed as qd
            qd.teardown(qd.setup("cpu", single_group=True))
        return 4

    keep = Finalized()
    cli.main = main
    cli.entry()
""")


def test_entry_skips_the_teardown_only_after_a_process_group():
    """cli.entry: after a group was created it ends through exit_process (no interpreter teardown), else through
    sys.exit (teardown runs); main's exit code either way. A plain sys.exit(main()) would run the teardown in both."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    got = {}
    for how in ("group", "none"):
        res = subprocess.run([sys.executable, "-c", ENTRY, how], env=env, capture_output=True, text=True, timeout=600)
        assert res.returncode == 4, res.stdout[-2000:] + res.stderr[-2000:]
        got[how] = res.stdout
    assert got == {"group": "", "none": "teardown ran"}

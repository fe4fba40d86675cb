"""Free ports for a test's own servers, and no process of a test left running."""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "benchmarks"))
import example_runs  # noqa: E402  benchmarks/example_runs.py (benchmarks/ is not a package)


def processes_mentioning(marker):
    """PIDs of processes whose command line contains marker (a test's own temp path)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append((int(pid), cmdline))
    return found


def left_behind(marker, grace=5.0):
    """The processes whose command line holds marker still there after grace seconds (those
    told to exit may take a moment to go): killed, and returned as (pid, command line)."""
    deadline = time.time() + grace
    while processes_mentioning(marker) and time.time() < deadline:
        time.sleep(0.1)
    left = processes_mentioning(marker)
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:  # gone meanwhile
            pass
    return left


def assert_nothing_left(marker, grace=5.0):
    """No process whose command line holds marker; any found after grace seconds is killed,
    and the test fails naming it."""
    left = left_behind(marker, grace)
    assert not left, "processes left running: %s" % left


def interruptible():
    """In the child before it runs: SIGINT at its default, as in a terminal. A suite started in
    the background of a script inherits SIGINT ignored, and an ignored signal cannot be
    trapped, so a launcher's Ctrl-C handling could not be tested."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def free_ports(count):
    """count distinct free ports, below the kernel's range of ephemeral ports (the benchmarks'
    example_runs.free_addresses picks them)."""
    ports = [int(address.rsplit(":", 1)[1]) for address in example_runs.free_addresses(count)]
    assert len(ports) == count, "no %d free ports below the ephemeral range" % count
    return ports


def free_port():
    return free_ports(1)[0]

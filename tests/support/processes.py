"""Free ports for a test's own servers, and no process of a test left running."""
import os
import random
import signal
import socket
import time


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


def assert_nothing_left(marker, grace=5.0):
    """No process whose command line holds marker; any found after grace seconds is killed,
    and the test fails naming it."""
    deadline = time.time() + grace
    while processes_mentioning(marker) and time.time() < deadline:
        time.sleep(0.1)  # processes that were told to exit may take a moment to go
    left = processes_mentioning(marker)
    for pid, _ in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "processes left running: %s" % left


def interruptible():
    """In the child before it runs: SIGINT at its default, as in a terminal. A suite started in
    the background of a script inherits SIGINT ignored, and an ignored signal cannot be
    trapped, so a launcher's Ctrl-C handling could not be tested."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def free_ports(count):
    """count distinct free ports, below the kernel's range of ephemeral ports: a port picked
    there could be handed to another socket (a notebook kernel's, a gRPC client's) between our
    choosing it and the server's binding it. Every probe stays bound until all are chosen."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_from = int(f.read().split()[0])
    candidates = random.Random().sample(range(10000, ephemeral_from), 200)
    probes = []
    for port in candidates:
        probe = socket.socket()
        try:
            probe.bind(("localhost", port))
        except OSError:  # in use
            probe.close()
            continue
        probes.append(probe)
        if len(probes) == count:
            break
    ports = [probe.getsockname()[1] for probe in probes]
    for probe in probes:
        probe.close()
    assert len(ports) == count, "no %d free ports below %d" % (count, ephemeral_from)
    return ports


def free_port():
    return free_ports(1)[0]

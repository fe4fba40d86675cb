"""Re-execute every Basics-Tutorial notebook top to bottom and save its outputs in place.

    python Basics-Tutorial/execute_notebooks.py              # all notebooks
    python Basics-Tutorial/execute_notebooks.py Servers      # only the ones whose path contains "Servers"

The committed notebooks keep the outputs of a real run of this script, so that they read well
on GitHub without being run. Each notebook gets a fresh kernel. The three 5-Multiple-Workers
notebooks form one cluster, so they run at the same time, each in its own kernel, on ports
passed through DTFG_PS_PORT, DTFG_WORKER0_PORT and DTFG_WORKER1_PORT: the documented defaults
2222-2224 when they are free, otherwise free ports picked now.

A notebook is written back only if every cell ran without error (for 5-Multiple-Workers: only if
all three did). TensorFlow's start-up lines (oneDNN, CUDA probing, CPU features), which its log
level setting cannot silence, are removed from the saved outputs; any other stderr output stays.
"""

import argparse
import asyncio
import os
import re
import socket
import subprocess
import sys
import time

import nbformat
from nbclient import NotebookClient

HERE = os.path.dirname(os.path.abspath(__file__))

SINGLE_NOTEBOOKS = [
    "1-Servers.ipynb",
    "2-Parameter-Server.ipynb",
    "3-Asynchronous-Updates.ipynb",
    "4-Local-then-Global-Variables.ipynb",
    "6-Starting-a-Run.ipynb",
    "7-Synchronous-SGD.ipynb",
    "8-Devices-and-In-Graph-Replication.ipynb",
    "9-TensorFlow-2-Strategies.ipynb",
]
MULTIPLE_WORKERS = [
    "5-Multiple-Workers/PS-Task.ipynb",
    "5-Multiple-Workers/Worker-0.ipynb",
    "5-Multiple-Workers/Worker-1.ipynb",
]
DEFAULT_PORTS = {"DTFG_PS_PORT": 2222, "DTFG_WORKER0_PORT": 2223, "DTFG_WORKER1_PORT": 2224}

# Start-up chatter printed before TensorFlow reads TF_CPP_MIN_LOG_LEVEL, or unaffected by it.
STARTUP_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|[IWE]\d{4} [\d:.]+ +\d+ (port|cudart_stub|cuda_platform|cuda_executor|cpu_feature_guard)\.cc:\d+\] .*"
    r"|To enable the following instructions: .*, in other operations, rebuild TensorFlow .*)$"
)


def port_is_free(port):
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
        return True


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def cluster_ports():
    if all(port_is_free(port) for port in DEFAULT_PORTS.values()):
        return {name: str(port) for name, port in DEFAULT_PORTS.items()}
    ports = {name: str(free_port()) for name in DEFAULT_PORTS}
    print("default ports 2222-2224 are busy; using", ports)
    return ports


def strip_startup_noise(nb):
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kept = []
        for output in cell.outputs:
            if output.output_type == "stream" and output.name == "stderr":
                lines = [l for l in output.text.splitlines(True) if not STARTUP_NOISE.match(l.rstrip("\n"))]
                if not "".join(lines).strip():
                    continue
                output.text = "".join(lines)
            kept.append(output)
        cell.outputs = kept
    return nb


async def execute(path, timeout, env=None):
    """Run one notebook on a fresh kernel in its own folder; return the executed copy."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        record_timing=False,
        coalesce_streams=True,
        resources={"metadata": {"path": os.path.dirname(path)}},
    )
    # The kernel process's own output (connection warnings, echoes of what the cells print)
    # would only clutter this script's output; what a cell prints still reaches the cell.
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    await client.async_execute(env=env if env is not None else dict(os.environ), **quiet)
    return strip_startup_noise(nb)


def last_line(error):
    """The line of an error (for a cell: the exception) that says what went wrong."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))  # tracebacks come with terminal colours
    lines = [line for line in text.splitlines() if line.strip()]
    return (lines[-1] if lines else repr(error))[:200]


async def run_all(selected, timeout):
    failures = []

    for name in SINGLE_NOTEBOOKS:
        if name not in selected:
            continue
        path = os.path.join(HERE, name)
        started = time.monotonic()
        try:
            nbformat.write(await execute(path, timeout), path)
            print("ok     %-45s %5.1f s" % (name, time.monotonic() - started))
        except Exception as error:  # keep going, report every failure at the end
            failures.append(name)
            print("FAILED %-45s %s" % (name, last_line(error)))

    if any(name in selected for name in MULTIPLE_WORKERS):
        env = dict(os.environ, DTFG_WAIT_SECONDS="120", **cluster_ports())
        paths = [os.path.join(HERE, name) for name in MULTIPLE_WORKERS]
        started = time.monotonic()
        results = await asyncio.gather(*(execute(p, timeout, env) for p in paths), return_exceptions=True)
        errors = [(n, r) for n, r in zip(MULTIPLE_WORKERS, results) if isinstance(r, BaseException)]
        if errors:
            for name, error in errors:
                failures.append(name)
                print("FAILED %-45s %s" % (name, last_line(error)))
        else:
            for path, nb in zip(paths, results):
                nbformat.write(nb, path)
            print("ok     %-45s %5.1f s" % ("5-Multiple-Workers/ (3 notebooks together)", time.monotonic() - started))
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("only", nargs="*", metavar="NAME",
                        help="run only notebooks whose path contains NAME (default: all)")
    parser.add_argument("--timeout", type=int, default=120, metavar="S",
                        help="seconds one cell may take (default: 120)")
    args = parser.parse_args()

    everything = SINGLE_NOTEBOOKS + MULTIPLE_WORKERS
    selected = [n for n in everything if not args.only or any(word in n for word in args.only)]
    if any(n in selected for n in MULTIPLE_WORKERS):
        selected += MULTIPLE_WORKERS  # the three only work together
    failures = asyncio.run(run_all(selected, args.timeout))
    if failures:
        sys.exit("failed: " + ", ".join(failures))


if __name__ == "__main__":
    main()

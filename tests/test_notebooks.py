"""The Basics-Tutorial notebooks run top to bottom, headless, each on a fresh kernel.

Every notebook is copied to a temporary folder and executed there, so the committed notebooks
(and their outputs) are never touched. The three 4-Multiple-Workers notebooks run together, as
the three processes of one cluster on free ports, and their printed output must show the
cross-worker effect. Afterwards no kernel and no TensorFlow server may be left running.
"""

import asyncio
import os
import re
import shutil
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from support.processes import free_ports

TUTORIAL = Path(__file__).resolve().parent.parent / "Basics-Tutorial"
SINGLE_NOTEBOOKS = [
    "1-Servers.ipynb",
    "2-Parameter-Server.ipynb",
    "3-Local-then-Global-Variables.ipynb",
    "5-Devices-and-In-Graph-Replication.ipynb",
]
MULTIPLE_WORKERS_DIR = "4-Multiple-Workers/"
MULTIPLE_WORKERS = ["PS-Task.ipynb", "Worker-0.ipynb", "Worker-1.ipynb"]
ALL_NOTEBOOKS = SINGLE_NOTEBOOKS + [MULTIPLE_WORKERS_DIR + name for name in MULTIPLE_WORKERS]

CELL_TIMEOUT = 120  # seconds one cell may take
PEER_WAIT_SECONDS = 60  # how long a 4-Multiple-Workers notebook waits for the others
CLEANUP_SECONDS = 15  # how long a kernel may take to disappear after its notebook ended
# one process runs them all (pytest-xdist): the cluster's notebooks share a module-scoped run,
# and the last test checks that no kernel this process started is left
pytestmark = pytest.mark.xdist_group("notebooks")


# --- Helpers ---


def listening(port):
    """Whether some process still listens on this TCP port (read from /proc/net, so that
    connections merely waiting out TIME_WAIT do not count)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local_address, state = row.split()[1], row.split()[3]
            if state == "0A" and int(local_address.rsplit(":", 1)[1], 16) == port:
                return True
    return False


def kernel_processes():
    """ipykernel processes descended from this test process (nbclient starts them as children)."""
    parent_of, cmdline_of = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/stat" % pid) as f:
                parent_of[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmdline_of[int(pid)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue  # the process ended while we looked

    def descends_from_me(pid):
        seen = set()
        while pid in parent_of and pid not in seen:
            seen.add(pid)
            pid = parent_of[pid]
            if pid == os.getpid():
                return True
        return False

    return [
        "%d %s" % (pid, cmd.strip())
        for pid, cmd in cmdline_of.items()
        if "ipykernel_launcher" in cmd and descends_from_me(pid)
    ]


def assert_nothing_left_running(ports=()):
    """Every kernel these tests started has exited and released its servers' ports."""
    deadline = time.monotonic() + CLEANUP_SECONDS
    while True:
        kernels = kernel_processes()
        busy_ports = [port for port in ports if listening(port)]
        if not kernels and not busy_ports:
            return
        if time.monotonic() > deadline:
            pytest.fail("left running: kernels %s, server ports %s" % (kernels, busy_ports))
        time.sleep(0.2)


def cluster_on_free_ports(wait_seconds):
    """Ports for the Multiple-Workers cluster, and the environment that hands them to the kernels."""
    ports = free_ports(3)
    env = dict(zip(["DTFG_PS_PORT", "DTFG_WORKER0_PORT", "DTFG_WORKER1_PORT"], map(str, ports)))
    env["DTFG_WAIT_SECONDS"] = str(wait_seconds)
    return ports, env


def copy_to(tmp_dir, relative_path):
    target = tmp_dir / relative_path
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(TUTORIAL / relative_path, target)
    return target


async def execute(path, env=None):
    """Run a notebook top to bottom on a fresh kernel, in its folder; save and return the result."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    await client.async_execute(env=dict(os.environ, **(env or {})))
    nbformat.write(nb, path)  # a temporary copy; kept for reading when a test fails
    return nb


def printed(nb):
    """Everything a notebook's cells printed to stdout, in order."""
    return "".join(
        output.text
        for cell in nb.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "stream" and output.name == "stdout"
    )


# --- Each concept notebook on its own ---


@pytest.mark.parametrize("name", SINGLE_NOTEBOOKS)
def test_notebook_runs_top_to_bottom_on_a_fresh_kernel(name, tmp_path):
    nb = asyncio.run(execute(copy_to(tmp_path, name)))

    code_cells = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code_cells] == list(range(1, len(code_cells) + 1))
    assert printed(nb), "the notebook printed nothing"
    assert_nothing_left_running()


# --- 4-Multiple-Workers: three notebooks, one cluster ---


@pytest.fixture(scope="module")
def multiple_workers(tmp_path_factory):
    """Run the ps and both workers at the same time, each on its own kernel; their printouts."""
    tmp_dir = tmp_path_factory.mktemp("multiple-workers")
    ports, env = cluster_on_free_ports(wait_seconds=PEER_WAIT_SECONDS)
    paths = [copy_to(tmp_dir, MULTIPLE_WORKERS_DIR + name) for name in MULTIPLE_WORKERS]

    async def run_cluster():
        return await asyncio.gather(*(execute(path, env) for path in paths))

    started = time.monotonic()
    notebooks = asyncio.run(run_cluster())
    assert time.monotonic() - started < 2 * PEER_WAIT_SECONDS
    assert_nothing_left_running(ports)
    return dict(zip(["ps", "worker 0", "worker 1"], map(printed, notebooks)))


def test_worker_1_sees_the_global_value_worker_0_wrote(multiple_workers):
    assert "worker 0 wrote shared_weight = 42.0" in multiple_workers["worker 0"]
    assert "worker 1 reads shared_weight = 42.0" in multiple_workers["worker 1"]


def test_worker_0_sees_the_change_worker_1_made(multiple_workers):
    assert "worker 1 made shared_weight = 142.0" in multiple_workers["worker 1"]
    assert "worker 0 reads shared_weight = 142.0" in multiple_workers["worker 0"]


def test_a_variable_on_a_worker_is_not_seen_by_the_other_worker(multiple_workers):
    worker_0 = re.findall(r"worker 0 own_counter = (\d+)", multiple_workers["worker 0"])
    worker_1 = re.findall(r"worker 1 own_counter = (\d+)", multiple_workers["worker 1"])
    assert worker_0 == ["5", "5"]  # before and after worker 1 counted on its own
    assert worker_1 == ["0", "1"]  # worker 0's 5 never shows up here


def test_the_chief_ends_the_run_only_after_every_worker_has_finished(multiple_workers):
    chief = multiple_workers["worker 0"]
    assert "worker 0 set up the run: finished = [-1, -1]" in chief
    assert "worker 1 finished: its entry of finished = 1" in multiple_workers["worker 1"]
    lines = [line for line in chief.splitlines() if "finished" in line or "run_over" in line]
    assert lines[-3:] == [
        "worker 0 finished: its entry of finished = 5",
        "worker 0 sees every worker finished: finished = [5, 1]",
        "worker 0 raised run_over: the ps may end",
    ]


def test_ps_ends_on_the_chiefs_flag_after_both_workers_finished(multiple_workers):
    ps = multiple_workers["ps"].rstrip().splitlines()
    # The ps waits for the chief's set-up, then for the flag; when it sees the flag, every
    # worker's entry is already written (no -1 left), and the workers' value is there to read.
    assert ps[-6:] == [
        "ps waiting for the chief to initialise run_over",
        "ps sees run_over initialised; waiting for the chief to raise it",
        "ps sees run_over = True",
        "finished = [5, 1]",
        "shared_weight = 142.0",
        "ps finished",
    ]


@pytest.mark.parametrize(
    "name, error, advice",
    [
        ("Worker-1.ipynb", "TimeoutError", "start the ps notebook"),  # no ps to connect to
        ("PS-Task.ipynb", "TimeoutError", "start Worker-0.ipynb"),  # no chief sets up the run
    ],
)
def test_a_notebook_whose_peers_never_start_fails_instead_of_hanging(name, error, advice, tmp_path):
    ports, env = cluster_on_free_ports(wait_seconds=3)

    started = time.monotonic()
    with pytest.raises(CellExecutionError, match=error) as failure:
        asyncio.run(execute(copy_to(tmp_path, MULTIPLE_WORKERS_DIR + name), env))
    assert failure.value.ename == error
    assert advice in failure.value.evalue  # the error says which notebook to start
    assert time.monotonic() - started < CELL_TIMEOUT
    assert_nothing_left_running(ports)


# --- The committed notebooks ---


@pytest.mark.parametrize("name", ALL_NOTEBOOKS)
def test_committed_notebook_keeps_the_outputs_of_one_top_to_bottom_run(name):
    nb = nbformat.read(TUTORIAL / name, as_version=4)
    code_cells = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code_cells] == list(range(1, len(code_cells) + 1))
    assert printed(nb)
    outputs = [output for cell in code_cells for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    text = nbformat.writes(nb)
    for machine_specific in ("/root/", "/home/", "/tmp/", "oneDNN", "cuInit"):
        assert machine_specific not in text


def test_no_kernel_or_server_is_left_running():
    assert_nothing_left_running()

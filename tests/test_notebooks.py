"""The Basics-Tutorial notebooks run top to bottom, headless, each on a fresh kernel, and
then a second time in the same kernel (a learner's Run All again).

Every notebook is copied to a temporary folder and executed there, so the committed notebooks
(and their outputs) are never touched. The three 5-Multiple-Workers notebooks run together, as
the three processes of one cluster on free ports, twice, and their printed output must show the
two workers training one model at the same time. Afterwards no kernel and no TensorFlow server may be left running.
"""

import asyncio
import contextlib
import copy
import json
import os
import re
import shutil
import socket
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
    "3-Asynchronous-Updates.ipynb",
    "4-Local-then-Global-Variables.ipynb",
    "6-Starting-a-Run.ipynb",
    "7-Synchronous-SGD.ipynb",
    "8-Devices-and-In-Graph-Replication.ipynb",
    "9-TensorFlow-2-Strategies.ipynb",
]
MULTIPLE_WORKERS_DIR = "5-Multiple-Workers/"
SHARED_SETUP = "tutorial_cluster.py"  # the helpers the notebooks import, beside them
MULTIPLE_WORKERS = ["PS-Task.ipynb", "Worker-0.ipynb", "Worker-1.ipynb"]
ALL_NOTEBOOKS = SINGLE_NOTEBOOKS + [MULTIPLE_WORKERS_DIR + name for name in MULTIPLE_WORKERS]

CELL_TIMEOUT = 120  # seconds one cell may take
PEER_WAIT_SECONDS = 120  # how long a 5-Multiple-Workers notebook waits for the others
CLEANUP_SECONDS = 15  # how long a kernel may take to disappear after its notebook ended
LONGEST_CODE_CELL = 30  # lines: a cell a learner reads at one glance

# What a notebook's own output must show, on every run: the behaviour its text teaches.
PROVEN_BY_OUTPUT = {
    "1-Servers.ipynb": [
        r"one class: True",  # tf.distribute.Server is tf.compat.v1.train.Server
        # TF_CONFIG's chief becomes worker 0, its workers come after it
        r"task \{\"type\": \"chief\", \"index\": 0\} +-> /job:worker/task:0",
        r"task \{\"type\": \"worker\", \"index\": 0\} +-> /job:worker/task:1",
        # without device_filters, a session waits for a worker that has not started, and
        # neither of TensorFlow's time limits ends that wait
        r"after 3 s the session still waits: True",
    ],
    "2-Parameter-Server.ipynb": [
        r"bytes per ps task: \[38420, 38420\]",  # fixed_size_partitioner balances the ps tasks
        r"Saver\(\): +SaveV2 ran on /job:worker/task:0\n",  # made outside the setter: on the chief
        # a sharded Saver (MonitoredTrainingSession's own) saves each ps's variables on that ps
        r"Saver\(sharded=True\): SaveV2 ran on /job:ps/task:0, /job:ps/task:1\n",
    ],
    "3-Asynchronous-Updates.ipynb": [
        # two reads at one step, two applies: the second update is one step stale
        r"global step +\d+: worker 1's update, read at step (\d+): staleness 0\n"
        # the race: worker 0's gradient lands on parameters that moved since its read
        r"the parameters worker 0 read have moved by up to (?!0\.000)\d\.\d{3} on the ps since\n"
        r"global step +\d+: worker 0's update, read at step \1: staleness 1",
        r"updates per worker: \[40, 40\] ; global step now: 82",  # every update counted once
        r"after two read-modify-writes of \+ 1: counter = 1: one update lost",
        r"after two assign_add\(1\) on the ps: +counter = 2",
    ],
    "4-Local-then-Global-Variables.ipynb": [
        # report_uninitialized_variables() checks local variables too, unless given a list
        r"worker 1 asks about global_variables\(\): \[\]",
        r"worker 1 asks the default question: +\[b'local/weights'",
        # replica_device_setter sends a LOCAL_VARIABLES variable to the ps too
        r"trapped/weights +local: True +on /job:ps/task:0",
        r"local/weights +local: True +on /job:worker/task:0",
    ],
    "6-Starting-a-Run.ipynb": [
        r"chief: trained to global step 20",  # MonitoredTrainingSession with StopAtStepHook
        # given no saver, MonitoredTrainingSession's Scaffold makes a sharded one: the ps saves
        r"its saver: sharded=True, SaveV2 on /job:ps/task:0\n",
        r"worker 1: trained to global step 40",
        # TensorFlow's chief restores its checkpoint over a ps that kept the live model
        r"the restarted chief \(MonitoredTrainingSession\): global step on the ps 40, "
        r"its session starts at 20: rolled back",
        # the examples' init_fn restores or initialises only what the ps lacks
        r"the restarted chief \(init_fn\): global step on the ps 25, its session starts at 25: "
        r"the ps kept the model: nothing to do",
        r"the chief, on a new ps: global step on the ps none, its session starts at 30: "
        r"restored model.ckpt-30",
        # WorkerSessionCreator's SessionManager looks every 30 s; the examples' every second
        r"default recovery_wait_secs: 30",
        r"a worker's wait with default: +DeadlineExceededError after [01] s",
        r"a worker's wait with recovery_wait_secs=1: the model is ready after [1-9] s",
    ],
    "7-Synchronous-SGD.ipynb": [
        # the accumulators' counts and the token queue's size, between the steps
        r"worker 0 has sent: +global_step=0  accumulators=\[1, 1\]  token_queue=0",
        r"worker 0 is still waiting: True",
        r"worker 1 has sent: +global_step=1  accumulators=\[0, 0\]  token_queue=0",
        r"worker 0 took tokens \[2, 3, 4, 5, 6, 7, 8, 9, 10, 11\]",
        r"worker 1 took tokens \[2, 3, 4, 5, 6, 7, 8, 9, 10, 11\]",
        r"worker 0 alone: DeadlineExceededError after 2 s",
        r"released the workers: +global_step=11  accumulators=\[1, 1\]  token_queue=2",
        r"the chief's queue runner has ended: True",
    ],
    "9-TensorFlow-2-Strategies.ipynb": [
        # ParameterServerStrategy: the variables on the ps, steps run by whichever worker is free
        r"weights:0 +on /job:ps/replica:0/task:0",
        r"schedule\(\) returned at once; a RemoteValue: True",
        r"300 more steps; steps by worker: \[[1-9]\d*, [1-9]\d*, [1-9]\d*\]",
        r"the global step on the ps grew by 310\n",
        # a worker killed mid-run: the others take its steps; back at its address, it rejoins
        r"while worker 2 is down: +steps by worker \[\d+, \d+, 0\]",
        r"worker 2 restarted: +steps by worker \[\d+, \d+, [1-9]\d*\]",
        # MultiWorkerMirroredStrategy: every worker gets the sum, and the same weights
        r"worker 0: its value 1, all-reduced: 3\n",
        r"worker 1: its value 2, all-reduced: 3\n",
        r"the same weights on both workers: True",
    ],
}
# The tests of the 5-Multiple-Workers run share its module-scoped fixture, so one process runs
# them all (pytest-xdist); each other test starts its own kernels and may run in either process,
# beside the other's (every test checks that its kernels have gone, and the last one that no
# kernel its process started is left).
with_the_cluster_run = pytest.mark.xdist_group("multiple-workers")


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
    """A copy of the notebook at relative_path, with the module of shared set-up it imports."""
    target = tmp_dir / relative_path
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(TUTORIAL / relative_path, target)
    shutil.copyfile(TUTORIAL / SHARED_SETUP, tmp_dir / SHARED_SETUP)
    return target


def client_for(path):
    nb = nbformat.read(path, as_version=4)
    return NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )


async def run_all(client, path):
    """Every cell once, top to bottom, in the client's kernel; a copy of the notebook as run."""
    for index, cell in enumerate(client.nb.cells):
        await client.async_execute_cell(cell, index)
    nbformat.write(client.nb, path)  # a temporary copy; kept for reading when a test fails
    return copy.deepcopy(client.nb)


async def execute(path, env=None):
    """Run a notebook top to bottom on a fresh kernel, in its folder; save and return the result."""
    client = client_for(path)
    await client.async_execute(env=dict(os.environ, **(env or {})))
    nbformat.write(client.nb, path)
    return client.nb


async def execute_together(paths, env=None, times=1):
    """Run the notebooks at the same time, each on a fresh kernel of its own, `times` times
    in those kernels (a learner's Run All, and Run All again once all have finished). Returns,
    for each run, the notebooks as they ran."""
    clients = [client_for(path) for path in paths]
    runs = []
    async with contextlib.AsyncExitStack() as kernels:
        for client in clients:
            await kernels.enter_async_context(
                client.async_setup_kernel(env=dict(os.environ, **(env or {}))))
        for _ in range(times):
            runs.append(await asyncio.gather(*(run_all(c, p) for c, p in zip(clients, paths))))
    return runs


async def run_all_twice_until_a_cell_fails(path, env, between):
    """Run All in one kernel until a cell fails, then between(), then Run All again: the error
    each run ended with (None for a run without one)."""
    client = client_for(path)
    errors = []
    async with client.async_setup_kernel(env=dict(os.environ, **env)):
        for run in range(2):
            if run:
                between()
            try:
                await run_all(client, path)
                errors.append(None)
            except CellExecutionError as error:
                errors.append(error)
    return errors


def ports_named_in(text):
    return sorted({int(port) for port in re.findall(r"localhost:(\d+)", text)})


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
def test_notebook_runs_top_to_bottom_on_a_fresh_kernel_and_again_in_the_same_kernel(
        name, tmp_path):
    first, second = asyncio.run(execute_together([copy_to(tmp_path, name)], times=2))
    first, second = first[0], second[0]  # (an error in a cell has failed the test by now)

    code_cells = [cell for cell in first.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code_cells] == list(range(1, len(code_cells) + 1))
    assert printed(first), "the notebook printed nothing"
    for run in (first, second):
        for line in PROVEN_BY_OUTPUT.get(name, []):
            assert re.search(line, printed(run)), "not printed: " + line
    # the kernel is gone, and with it every server the notebook started (both runs')
    assert_nothing_left_running(ports_named_in(printed(first) + printed(second)))


# --- 5-Multiple-Workers: three notebooks, one cluster ---


@pytest.fixture(scope="module")
def multiple_workers_twice(tmp_path_factory):
    """Run the ps and both workers at the same time, each on its own kernel, then once more in
    the same kernels (Run All again in all three); their printouts, run by run."""
    tmp_dir = tmp_path_factory.mktemp("multiple-workers")
    ports, env = cluster_on_free_ports(wait_seconds=PEER_WAIT_SECONDS)
    paths = [copy_to(tmp_dir, MULTIPLE_WORKERS_DIR + name) for name in MULTIPLE_WORKERS]

    started = time.monotonic()
    runs = asyncio.run(execute_together(paths, env, times=2))
    assert time.monotonic() - started < 2 * PEER_WAIT_SECONDS
    assert_nothing_left_running(ports)
    return [dict(zip(["ps", "worker 0", "worker 1"], map(printed, run))) for run in runs]


@pytest.fixture(scope="module", params=["first run", "second run in the same kernels"])
def multiple_workers(request, multiple_workers_twice):
    return multiple_workers_twice[request.param.startswith("second")]


PUSHES = 15  # each worker's pushes per algorithm (the worker notebooks' PUSHES)


def pushes(multiple_workers, worker, algorithm):
    """(global step the push made, staleness, global test accuracy) of each push printed."""
    return [(int(step), int(staleness), float(accuracy)) for step, staleness, accuracy in re.findall(
        r"worker %d %s +push at global step +(\d+), staleness (\d+): global test accuracy ([\d.]+)"
        % (worker, algorithm), multiple_workers["worker %d" % worker])]


@with_the_cluster_run
@pytest.mark.parametrize("algorithm", ["ADAG", "DOWNPOUR"])
def test_both_workers_push_and_the_ps_counts_every_push_once(multiple_workers, algorithm):
    steps = [step for worker in (0, 1) for step, _, _ in pushes(multiple_workers, worker, algorithm)]
    assert sorted(steps) == list(range(1, 2 * PUSHES + 1))


def assert_the_workers_pushed_at_the_same_time(multiple_workers):
    """Each worker's pushes, of either algorithm, interleave with the other's: some of each
    worker's pushes are stale, computed on a pull that the other worker's push overtook."""
    for algorithm in ("ADAG", "DOWNPOUR"):
        for worker in (0, 1):
            made = pushes(multiple_workers, worker, algorithm)
            stale = [step for step, staleness, _ in made if staleness > 0]
            assert stale, "worker %d's %s pushes all had staleness 0: %s" % (
                worker, algorithm, made)
            # a push's staleness counts the other worker's pushes since the pull: never more
            for step, staleness, _ in made:
                assert 0 <= staleness < step


@with_the_cluster_run
def test_the_workers_push_at_the_same_time_without_waiting_for_each_other(multiple_workers):
    assert_the_workers_pushed_at_the_same_time(multiple_workers)


def test_the_saved_outputs_show_both_workers_pushing_at_the_same_time():
    saved = {"worker %d" % worker: printed(nbformat.read(
        TUTORIAL / MULTIPLE_WORKERS_DIR / ("Worker-%d.ipynb" % worker), as_version=4))
        for worker in (0, 1)}
    assert_the_workers_pushed_at_the_same_time(saved)


@with_the_cluster_run
@pytest.mark.parametrize("algorithm", ["ADAG", "DOWNPOUR"])
def test_the_global_test_accuracy_rises_as_both_workers_push(multiple_workers, algorithm):
    chief = multiple_workers["worker 0"]
    columns = {"ADAG": 1, "DOWNPOUR": 2}
    before = re.search(r"global test accuracy before training: ADAG ([\d.]+), DOWNPOUR ([\d.]+)",
                       chief)
    after = re.search(r"global test accuracy after training: ADAG ([\d.]+), DOWNPOUR ([\d.]+)",
                      chief)
    assert float(before.group(columns[algorithm])) < 0.3  # a model of zeros: one class
    assert float(after.group(columns[algorithm])) > 0.75
    for worker in (0, 1):
        assert len(pushes(multiple_workers, worker, algorithm)) == PUSHES


@with_the_cluster_run
def test_local_copies_are_made_on_the_worker_and_the_global_copy_on_the_ps(multiple_workers):
    for worker in (0, 1):
        printed_by = multiple_workers["worker %d" % worker]
        assert re.search(r"adag/weights +on /job:ps/task:0", printed_by)
        assert re.search(r"adag/local/weights +on /job:worker/task:%d" % worker, printed_by)
        assert "the Adagrad slots on ['/job:ps/task:0']" in printed_by


@with_the_cluster_run
def test_the_chief_ends_the_run_only_after_every_worker_has_finished(multiple_workers):
    chief = multiple_workers["worker 0"]
    assert "worker 1 finished: its entry of finished = %d" % (2 * PUSHES) in multiple_workers["worker 1"]
    lines = [line for line in chief.splitlines() if "finished" in line or "run_over" in line]
    assert lines[-2:] == [
        "worker 0 sees every worker finished: finished = [%d, %d]" % (2 * PUSHES, 2 * PUSHES),
        "worker 0 raised run_over: the ps may end",
    ]


@with_the_cluster_run
def test_ps_ends_on_the_chiefs_flag_after_both_workers_finished(multiple_workers):
    ps = multiple_workers["ps"].rstrip().splitlines()
    # The ps waits for the chief's set-up, then for the flag; when it sees the flag, every
    # worker's entry is already written (no -1 left).
    assert ps[-5:] == [
        "ps waiting for the chief to initialise run_over",
        "ps sees run_over initialised; waiting for the chief to raise it",
        "ps sees run_over = True",
        "finished = [%d, %d]" % (2 * PUSHES, 2 * PUSHES),
        "ps finished",
    ]


def test_a_worker_notebook_whose_ps_never_starts_fails_instead_of_hanging(tmp_path):
    ports, env = cluster_on_free_ports(wait_seconds=3)

    started = time.monotonic()
    with pytest.raises(CellExecutionError, match="TimeoutError") as failure:
        asyncio.run(execute(copy_to(tmp_path, MULTIPLE_WORKERS_DIR + "Worker-1.ipynb"), env))
    assert failure.value.ename == "TimeoutError"
    assert "start the ps notebook" in failure.value.evalue  # the error says what to start
    assert time.monotonic() - started < CELL_TIMEOUT
    assert_nothing_left_running(ports)


def test_the_ps_notebook_says_its_port_is_taken_then_that_no_chief_came_instead_of_hanging(
        tmp_path):
    # a learner's path: the port is taken (by an earlier run, as far as the ps can tell); they
    # free it and Run All again in the same kernel, but start no chief
    ports, env = cluster_on_free_ports(wait_seconds=3)
    squatter = socket.socket()
    squatter.bind(("localhost", ports[0]))
    squatter.listen()
    started = time.monotonic()
    try:
        taken, no_chief = asyncio.run(run_all_twice_until_a_cell_fails(
            copy_to(tmp_path, MULTIPLE_WORKERS_DIR + "PS-Task.ipynb"), env, squatter.close))
    finally:
        squatter.close()
    assert taken.ename == "OSError"
    assert "port %d is already in use: by an earlier run?" % ports[0] in taken.evalue
    assert "Kernel > Shut Down" in taken.evalue  # and what to do about it
    assert no_chief.ename == "TimeoutError"
    assert "start Worker-0.ipynb" in no_chief.evalue  # the error says which notebook to start
    assert time.monotonic() - started < CELL_TIMEOUT
    assert_nothing_left_running(ports)


# --- The committed notebooks ---


@pytest.mark.parametrize("name", ALL_NOTEBOOKS)
def test_no_code_cell_is_longer_than_a_learner_reads_at_one_glance(name):
    nb = nbformat.read(TUTORIAL / name, as_version=4)
    too_long = [(index, len(cell.source.splitlines())) for index, cell in enumerate(nb.cells)
                if cell.cell_type == "code" and len(cell.source.splitlines()) > LONGEST_CODE_CELL]
    assert not too_long, "code cells (index, lines) over %d lines" % LONGEST_CODE_CELL


def code_of(name):
    nb = nbformat.read(TUTORIAL / name, as_version=4)
    return "\n".join(cell.source for cell in nb.cells if cell.cell_type == "code")


def test_the_shared_set_up_is_written_once_and_imported_by_the_other_notebooks():
    # 1-Servers builds free_port and start_server in view; the others import them
    for name in ALL_NOTEBOOKS:
        code = code_of(name)
        if name == "1-Servers.ipynb":
            assert "def free_port" in code and "def start_server" in code
        elif "tf.compat.v1.train.ClusterSpec" in code:  # every notebook that starts a cluster
            assert "from tutorial_cluster import" in code, name
            assert "def free_port" not in code and "def start_server" not in code, name


@pytest.mark.parametrize("name", ALL_NOTEBOOKS)
def test_a_notebook_hands_back_named_values_and_reads_no_private_attribute(name):
    code = code_of(name)
    assert "SimpleNamespace" not in code  # a namedtuple says what a function hands back
    assert not re.findall(r"\w\._[a-z]\w*", code)  # e.g. SyncReplicasOptimizer._accumulator_list


def test_every_notebook_of_the_tutorial_is_tested_and_listed_in_its_readme():
    found = sorted(str(path.relative_to(TUTORIAL)) for path in TUTORIAL.rglob("*.ipynb")
                   if ".ipynb_checkpoints" not in str(path))
    assert found == sorted(ALL_NOTEBOOKS)
    readme = (TUTORIAL / "README.md").read_text()
    for name in SINGLE_NOTEBOOKS:
        assert name in readme


@pytest.mark.parametrize("name", SINGLE_NOTEBOOKS)
def test_committed_notebook_shows_what_its_text_teaches(name):
    saved = printed(nbformat.read(TUTORIAL / name, as_version=4))
    for line in PROVEN_BY_OUTPUT.get(name, []):
        assert re.search(line, saved), "not in the saved outputs: " + line


@pytest.mark.parametrize("name", ALL_NOTEBOOKS)
def test_committed_notebook_keeps_the_outputs_of_one_top_to_bottom_run(name):
    nb = nbformat.read(TUTORIAL / name, as_version=4)
    code_cells = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code_cells] == list(range(1, len(code_cells) + 1))
    assert printed(nb)
    outputs = [output for cell in code_cells for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    text = nbformat.writes(nb)
    for machine_specific in ("/root/", "/home/", "/tmp/"):
        assert machine_specific not in text
    # TensorFlow's start-up lines, which the first code cell names, are left out of the outputs
    printed_anywhere = json.dumps([output for output in outputs])
    for startup_line in ("oneDNN", "cuInit", "Could not find cuda drivers"):
        assert startup_line not in printed_anywhere


def test_no_kernel_or_server_is_left_running():
    assert_nothing_left_running()

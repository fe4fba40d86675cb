"""deploy/slurm/train.sbatch under a real Slurm: munged, slurmctld and a slurmd on each of three
nodes, every node a host of its own on this machine (support/slurm.py). Each example below
trains to its bar as a submitted job and ends with exit 0; a job submitted again with the same
--log_dir resumes from its last checkpoint; a worker killed mid-job ends its job within 90 s,
in one line naming it; scancel leaves no process within 30 s; bad input fails in one line.
Skipped, in one line, where Slurm is not installed or the tests do not run as root (.ci/run
installs it: apt-get install slurm-wlm munge).

Each job is played once in the test run, the first time a test asks for it, and the tests read
what it left (support/slurm.py, SlurmRuns): the plays come first below, the tests after them."""
import os
import re
import signal
import time

import pytest

from support.examples import ACCURACY_BAR, USERS_ENVIRONMENT
from support.processes import processes_mentioning
from support.slurm import SlurmRuns, missing_for_slurm

pytestmark = [pytest.mark.skipif(missing_for_slurm() is not None,
                                 reason=missing_for_slurm() or ""),
              pytest.mark.timeout(600)]  # a test may wait for the other process's job first

ONE_A_NODE = ["--nodes", "3", "--ntasks-per-node", "1"]
# example: sbatch's options, train.py's arguments (enough steps for the bar), the tasks it
# starts, and the chief's role. The cluster's first task is the chief (Keras-Fit's coordinator)
JOBS = {
    "DOWNPOUR": (ONE_A_NODE, ["--steps", "800"], {"ps0", "worker0", "worker1"}, "worker0"),
    "Sync-SGD": (ONE_A_NODE, ["--steps", "800"], {"ps0", "worker0", "worker1"}, "worker0"),
    "MultiWorkerMirroredStrategy": (["--nodes", "2", "--ntasks-per-node", "1"],
                                    ["--steps", "600"], {"worker0", "worker1"}, "worker0"),
    "Keras-Fit": (["--nodes", "3", "--ntasks", "4"],
                  ["--strategy", "parameter_server", "--steps", "800"],
                  {"chief0", "ps0", "worker0", "worker1"}, "chief0"),
}
# the tasks of one step start together: no need to wait 600 s for one (TF_CONFIG's default)
QUICK = ["--connect_timeout", "60", "--watchdog", "60"]
LONG = ["--steps", "1000000", "--log_every", "50"]  # runs until it is stopped


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    runs = SlurmRuns(tmp_path_factory)
    yield runs
    assert runs.close() == [], "left running at the end, and killed"


# --- The plays ------------------------------------------------------------------------------------
def trained(example):
    """The example's job of JOBS, to its end."""
    def play(slurm, folder):
        options, args = JOBS[example][:2]
        env = USERS_ENVIRONMENT if example == "Keras-Fit" else None  # a Keras model: Keras
        job = slurm.submit(folder, example, options, train_args=args + QUICK, env=env)
        job.wait(timeout=300)
        return job.ended()
    return play


def submitted_again_then_a_worker_killed(runs):
    """DOWNPOUR's job submitted again with the same --log_dir; once it has resumed and worker1
    has trained a little, worker1's train.py is killed (SIGKILL)."""
    first = runs.get("DOWNPOUR", trained("DOWNPOUR"))

    def play(slurm, folder):
        job = slurm.submit(folder, "DOWNPOUR", ONE_A_NODE, log_dir=first.log_dir,
                           train_args=LONG + QUICK)
        pid = job.started("worker1")[0]
        job.wait_for_line("[worker1] local_step=", timeout=120)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.time()
        job.wait(timeout=120)
        return job.ended(killed_to_end=job.ended_at - killed_at)
    return first, runs.get("DOWNPOUR-again-killed", play)


def cancelled(slurm, folder):
    """A DOWNPOUR job cancelled (scancel) once the chief trains; how long until none of its
    processes is left anywhere."""
    job = slurm.submit(folder, "DOWNPOUR", ONE_A_NODE, train_args=LONG + QUICK)
    job.wait_for_line("[worker0] local_step=", timeout=120)
    running = len(processes_mentioning(folder))  # the batch script, every task and its train.py
    slurm.command(["scancel", job.id])
    cancelled_at, deadline = time.time(), time.time() + 60
    while processes_mentioning(folder) or slurm.processes_on_nodes():
        if time.time() > deadline:
            break
        time.sleep(0.1)
    gone_in = time.time() - cancelled_at
    job.wait(timeout=30)
    return job.ended(running=running, gone_in=gone_in)


def started_tasks(ended):
    """role: (address, task, node) from each `[slurm] started ROLE pid=N at ADDRESS (task T on
    NODE)` line."""
    return {role: (address, task, node) for role, address, task, node in re.findall(
        r"^\[slurm\] started (\w+) pid=\d+ at (\S+) \(task (\d+) on (\S+)\)$", ended.output, re.M)}


# --- The tests ------------------------------------------------------------------------------------
@pytest.mark.parametrize("example", JOBS)
def test_each_example_trains_to_its_bar_as_a_batch_job_over_several_nodes(example, runs,
                                                                          record_property):
    job = runs.get(example, trained(example))
    record_property("sbatch_to_end_s", round(job.seconds, 1))  # --junitxml keeps it
    options, _, roles, chief = JOBS[example]
    assert (job.state, job.exit_code) == ("COMPLETED", "0:0"), job.output[-3000:]
    summary = job.summary(chief)
    assert float(summary["test_accuracy"]) >= ACCURACY_BAR, summary
    assert summary["workers"] == "2" and summary["lost_workers"] == "0", summary
    tasks = started_tasks(job)
    assert set(tasks) == roles, job.output[-3000:]
    # each task listens on its own node, and the tasks are spread over every node of the job
    assert all(address.split(":")[0] == node for address, _, node in tasks.values()), tasks
    nodes = int(options[options.index("--nodes") + 1])
    assert len({node for _, _, node in tasks.values()}) == nodes, tasks
    assert "[slurm] failed" not in job.output and "Traceback" not in job.output
    if roles == {"ps0", "worker0", "worker1"}:  # the ps ends when the chief says the run is over
        assert "[ps0] the run is over; shutting down" in job.output
    if "chief0" in roles:  # ParameterServerStrategy's servers end once the coordinator is gone
        coordinator = tasks["chief0"][0]
        for role in ("ps0", "worker0", "worker1"):
            assert "[%s] %s is gone; shutting down" % (role, coordinator) in job.output, role
    assert job.left == []


def test_a_job_submitted_again_with_the_same_log_dir_resumes_from_its_last_checkpoint(runs):
    first, again = submitted_again_then_a_worker_killed(runs)
    step = first.summary()["global_step"]  # its last checkpoint is the one it saved at the end
    assert "[worker0] resuming from the checkpoint at global step %s" % step in again.output, \
        again.output[-3000:]


def test_a_worker_killed_mid_job_ends_the_job_within_90_s_in_one_line_naming_it(runs):
    _, job = submitted_again_then_a_worker_killed(runs)
    assert job.state == "FAILED" and job.killed_to_end < 90, (job.killed_to_end, job.output)
    _, task, node = started_tasks(job)["worker1"]
    failed = [line for line in job.lines() if line.startswith("[slurm] failed")]
    assert failed == ["[slurm] failed: worker1 (task %s on %s: killed by SIGKILL); srun ends the "
                      "job step" % (task, node)], job.output[-3000:]
    assert "[slurm] the job step failed: submit again with --log_dir %s" % job.log_dir \
        in job.output  # and how to go on
    assert job.left == []


def test_scancel_stops_every_task_within_30_s_and_leaves_nothing(runs):
    job = runs.get("DOWNPOUR-cancelled", cancelled)
    assert job.running >= 7 and job.state == "CANCELLED", job.output[-3000:]
    assert job.gone_in < 30 and job.left == [], (job.gone_in, job.left)


@pytest.mark.parametrize("name, example, options, script_args, message", [
    ("one-process", "Non-Distributed-Setup", ONE_A_NODE, [],
     "Non-Distributed-Setup trains in one process and reads no TF_CONFIG"),
    ("no-ps", "MultiWorkerMirroredStrategy", ONE_A_NODE, ["--ps", "1"],
     "MultiWorkerMirroredStrategy has no parameter servers: leave out --ps"),
    ("no-worker", "DOWNPOUR", ["--ntasks", "2"], ["--ps", "2"],
     "2 task(s) leave no worker for DOWNPOUR: ask Slurm for at least 3 (--ntasks)"),
    ("unknown-option", "DOWNPOUR", ["--ntasks", "3"], ["--workers", "2"],
     "unknown option --workers"),
    ("no-example", "No-Such-Example", ["--ntasks", "3"], [], "no No-Such-Example/train.py here"),
])
def test_bad_input_fails_the_job_at_once_in_one_line(runs, name, example, options, script_args,
                                                     message):
    def play(slurm, folder):
        job = slurm.submit(folder, example, options, script_args=script_args)
        job.wait(timeout=60)
        return job.ended()
    job = runs.get("bad-input-" + name, play)
    assert (job.state, job.exit_code) == ("FAILED", "2:0"), job.output
    assert len(job.lines()) == 1 and job.lines()[0].startswith("[slurm] error: " + message), \
        job.output

"""Distributed-Setup, the template every distributed example copies: training end to end, the
life cycle of every process (clean end, a lost worker, a lost chief, Ctrl-C), bad input, the cluster
from flags or TF_CONFIG, and the data pipeline every example shares."""
import json
import os
import signal
import socket
import subprocess
import time

import numpy as np
import pytest

from conftest import (ACCURACY_BAR, assert_nothing_left, error_lines, finish, free_port,
                      free_ports, kill_mid_run, load_train_module, read_until, run_train,
                      run_train_noting_tensorflow, start_example)


# --- Training end to end through run.sh -----------------------------------------------------------
def test_distributed_setup_reaches_the_accuracy_bar_and_every_process_exits(run_example,
                                                                             tmp_path):
    metrics_file = tmp_path / "metrics.json"
    run = run_example("Distributed-Setup", "--metrics_file", str(metrics_file), timeout=180)
    assert run.code == 0, run.output[-3000:]
    summary = run.summary()
    metrics = json.loads(metrics_file.read_text())  # the same summary, and the accuracy history
    assert metrics["global_step"] == int(summary["global_step"]) and metrics["history"]
    assert float(summary["test_accuracy"]) >= ACCURACY_BAR
    local_steps = [int(s) for s in summary["local_steps"].split(",")]
    assert summary["workers"] == "2" and len(local_steps) == 2 and summary["lost_workers"] == "0"
    # each worker stops once a step shows it the global step at --steps; the other worker's steps
    # already under way still land
    assert 2000 <= int(summary["global_step"]) == sum(local_steps) <= 2003
    assert float(summary["steps_per_sec"]) > 0
    assert "[ps0] the run is over; shutting down" in run.output
    assert "[run.sh] all processes finished" in run.output
    # the chief wrote real checkpoints and TensorBoard events
    names = os.listdir(tmp_path / "logs")
    assert "checkpoint" in names and any(n.startswith("events.out.tfevents") for n in names)


def test_one_worker_alone_trains_every_step_itself(run_example):
    run = run_example("Distributed-Setup", "--steps", "300", env={"NUM_WORKERS": "1"})
    assert run.code == 0, run.output[-3000:]
    summary = run.summary()
    assert summary["workers"] == "1" and summary["local_steps"] == summary["global_step"] == "300"
    assert "[ps0] the run is over; shutting down" in run.output


@pytest.mark.parametrize("sharding", [[], ["--shard_variables"]])
def test_two_parameter_servers_share_the_variables_and_both_exit(run_example, sharding):
    run = run_example("Distributed-Setup", "--steps", "300", *sharding,
                      env={"NUM_PS": "2", "NUM_WORKERS": "2"})
    assert run.code == 0, run.output[-3000:]
    assert run.summary()["ps"] == "2"
    for ps in ("ps0", "ps1"):
        assert "[%s] the run is over; shutting down" % ps in run.output


def test_non_chief_workers_start_training_within_seconds_of_the_chief(run_example):
    # the stock MonitoredTrainingSession would keep worker1 waiting about 30 s
    run = run_example("Distributed-Setup", "--steps", "3000", env={"NUM_WORKERS": "2"})
    assert run.code == 0, run.output[-3000:]
    lag = run.first_time("[worker1] training started") - run.first_time(
        "[worker0] training started")
    assert lag < 3.0, "worker1 started %.1f s after the chief" % lag
    local_steps = [int(s) for s in run.summary()["local_steps"].split(",")]
    assert local_steps[1] > 0.25 * sum(local_steps)


def test_a_rerun_with_the_same_log_dir_resumes_from_the_checkpoint(run_example, tmp_path):
    log_dir = str(tmp_path / "resume")
    one_worker = {"NUM_WORKERS": "1"}
    first = run_example("Distributed-Setup", "--steps", "300", log_dir=log_dir, env=one_worker)
    assert first.code == 0 and first.summary()["global_step"] == "300", first.output[-3000:]
    # the parameters come back, not only the step: a rerun with nothing left to train
    # evaluates the checkpointed parameters, and scores exactly what the first run scored
    again = run_example("Distributed-Setup", "--steps", "300", log_dir=log_dir, env=one_worker)
    assert again.code == 0, again.output[-3000:]
    assert "resuming from the checkpoint at global step 300" in again.output
    assert again.summary()["updates"] == "0"
    assert again.summary()["test_accuracy"] == first.summary()["test_accuracy"]
    second = run_example("Distributed-Setup", "--steps", "500", log_dir=log_dir, env=one_worker)
    assert second.code == 0, second.output[-3000:]
    assert "resuming from the checkpoint at global step 300" in second.output
    summary = second.summary()
    assert summary["global_step"] == "500" and summary["local_steps"] == "200"


def test_the_default_log_dir_is_new_for_every_run(tmp_path):
    train = load_train_module("Distributed-Setup")
    first = train.parse_flags([], train.example_flags).log_dir
    time.sleep(1.1)  # the folder name has one-second resolution plus the process id
    assert train.parse_flags([], train.example_flags).log_dir != first


def test_a_worker_killed_mid_run_does_not_hang_the_others(tmp_path):
    run = kill_mid_run("Distributed-Setup", tmp_path, ["--steps", "3000"])  # the chief goes on
    assert run.code == 1
    summary = run.summary()
    assert summary["global_step"] == "3000" and summary["lost_workers"] == "1"
    assert float(summary["test_accuracy"]) >= ACCURACY_BAR
    assert "[worker0] worker(s) 1 failed or were lost" in run.output
    assert "[ps0] the run is over; shutting down" in run.output
    assert "worker1 (exit 137)" in run.output
    assert_nothing_left(str(tmp_path))


def test_a_lost_chief_stops_the_run_with_the_command_that_resumes_it(tmp_path):
    # Without the chief nobody saves checkpoints or reports, so run.sh stops the others at once
    # and prints the exact command that carries on from the chief's last checkpoint.
    run = kill_mid_run("Distributed-Setup", tmp_path, ["--steps", "3000"], victim="worker0")
    assert run.code == 1, run.output[-3000:]
    assert time.time() - run.killed_at < 60
    assert "[run.sh] failed: worker0 (exit 137); stopping the others" in run.output
    resume = [l for _, l in run.lines if "resume from its last checkpoint with: " in l]
    assert len(resume) == 1 and "the chief (worker0) failed" in resume[0], run.output[-3000:]
    command = resume[0].split("with: ", 1)[1]
    assert "--log_dir %s" % (tmp_path / "logs") in command and "--steps 3000" in command
    assert_nothing_left(str(tmp_path))
    resumed = finish(subprocess.Popen(command, shell=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True), timeout=180)
    assert resumed.code == 0, resumed.output[-3000:]
    assert "resuming from the checkpoint at global step" in resumed.output
    assert float(resumed.summary()["test_accuracy"]) >= ACCURACY_BAR
    assert_nothing_left(str(tmp_path))


def test_a_lost_parameter_server_stops_the_run_in_one_line_per_worker(tmp_path):
    proc = start_example("Distributed-Setup", ["--log_dir", str(tmp_path / "logs"),
                                               "--steps", "100000", "--log_every", "50"])
    seen = read_until(proc, "[worker0] local_step=", timeout=120)
    os.kill(int(seen.split("started ps0 pid=")[1].split()[0]), signal.SIGKILL)
    killed_at = time.time()
    run = finish(proc, timeout=60)
    assert run.code == 1 and time.time() - killed_at < 40, run.output[-3000:]
    assert "[run.sh] failed: ps0 (exit 137)" in run.output and "Traceback" not in run.output
    errors = [l for _, l in run.lines if "] error: " in l]  # a worker may be stopped first
    assert all(" stopped: UnavailableError: " in l for l in errors), errors
    assert_nothing_left(str(tmp_path))


def test_ctrl_c_stops_every_process(tmp_path):
    proc = start_example("Distributed-Setup", ["--log_dir", str(tmp_path / "logs"),
                                               "--steps", "100000"], env={"NUM_WORKERS": "2"})
    read_until(proc, "[worker1] training started", timeout=90)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends to the foreground group
    run = finish(proc, timeout=30)
    assert run.code == 130, run.output[-2000:]
    assert "interrupted: stopping every process" in run.output
    assert_nothing_left(str(tmp_path))


def test_the_launcher_picks_different_ports_for_two_runs_at_once(tmp_path):
    procs = [start_example("Distributed-Setup", ["--log_dir", str(tmp_path / ("logs%d" % i)),
                                                 "--steps", "200"]) for i in range(2)]
    runs = [finish(p, timeout=120) for p in procs]
    for run in runs:
        assert run.code == 0, run.output[-3000:]
    ports = [set(l.split("localhost:")[1] for _, l in r.lines if "] started " in l) for r in runs]
    assert not ports[0] & ports[1]
    assert_nothing_left(str(tmp_path))


# --- A real cluster: tasks that start late, a chief that restarts ---------------------------------
class Tasks(object):
    """Tasks of one Distributed-Setup cluster on localhost, started one by one as a test says;
    each task's output is collected in a thread (with arrival times) and all of them are
    stopped at the end whatever happened."""

    def __init__(self, tmp_path, workers, *args):
        import sys
        import threading
        self.threading = threading
        ports = free_ports(1 + workers)
        self.common = [sys.executable, os.path.join(os.path.dirname(__file__), "..",
                                                    "Distributed-Setup", "train.py"),
                       "--ps_hosts", "localhost:%d" % ports[0], "--worker_hosts",
                       ",".join("localhost:%d" % p for p in ports[1:]),
                       "--log_dir", str(tmp_path / "logs")] + list(args)
        self.env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        self.procs, self.lines = {}, {}

    def start(self, job, index=0):
        role = "%s%d" % (job, index)
        proc = subprocess.Popen(self.common + ["--job_name", job, "--task_index", str(index)],
                                env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        self.procs[role], lines = proc, self.lines.setdefault(role, [])
        self.threading.Thread(target=lambda: [lines.append((time.time(), l.rstrip("\n")))
                                              for l in proc.stdout], daemon=True).start()
        return proc

    def wait_for_line(self, role, text, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any(text in line for _, line in self.lines[role]):
                return
            assert self.procs[role].poll() is None or any(
                text in line for _, line in self.lines[role]), self.output(role)
            time.sleep(0.1)
        raise AssertionError("no %r from %s in %g s:\n%s" % (text, role, timeout,
                                                            self.output(role)))

    def output(self, role):
        return "\n".join(line for _, line in self.lines[role])

    def stop_all(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def test_a_parameter_server_that_no_chief_reaches_ends_with_one_line_and_a_failure():
    code, _, stderr = run_train("Distributed-Setup", ["--job_name", "ps", "--connect_timeout",
                                                      "2"] + cluster())
    assert code == 2
    assert error_lines(stderr) == ["error: ps0: no chief came within 2 s: this ps served no one"]


def test_the_chief_waits_for_a_worker_that_starts_after_it_has_finished(tmp_path):
    # worker 1 starts only once the chief has trained the whole budget: it is not lost, it is
    # late; the ps ends only once the chief, having seen worker 1 finish, ends the run
    tasks = Tasks(tmp_path, 2, "--steps", "300", "--log_every", "100")
    try:
        ps, chief = tasks.start("ps"), tasks.start("worker", 0)
        tasks.wait_for_line("worker0", "local_step=300", timeout=120)  # its budget, alone
        assert ps.poll() is None and chief.poll() is None
        late = tasks.start("worker", 1)
        assert late.wait(timeout=120) == 0, tasks.output("worker1")
        assert chief.wait(timeout=60) == 0, tasks.output("worker0")
        assert ps.wait(timeout=30) == 0, tasks.output("ps0")
        summary = [l for _, l in tasks.lines["worker0"] if "] summary " in l][0]
        assert "lost_workers=0" in summary and "local_steps=300,0" in summary
        assert "[ps0] the run is over; shutting down" in tasks.output("ps0")
        # the ps heard of the end after the late worker had finished, not when ports closed
        done = [t for t, l in tasks.lines["worker1"] if "done: local_steps=0" in l][0]
        over = [t for t, l in tasks.lines["ps0"] if "the run is over" in l][0]
        assert over > done
    finally:
        tasks.stop_all()
    assert_nothing_left(str(tmp_path))


def test_a_chief_killed_and_restarted_takes_the_run_up_where_the_ps_left_it(tmp_path):
    # the ps kept the variables, which worker 1 trained on meanwhile: the restarted chief goes on
    # from them (a checkpoint would roll the run back) and ends the run
    tasks = Tasks(tmp_path, 2, "--steps", "3000", "--log_every", "50")
    try:
        ps, chief, other = tasks.start("ps"), tasks.start("worker", 0), tasks.start("worker", 1)
        tasks.wait_for_line("worker0", "local_step=100", timeout=120)
        chief.kill()
        chief.wait()
        last_seen = max(int(l.split("global_step=")[1].split()[0])
                        for _, l in tasks.lines["worker0"] if "global_step=" in l)
        assert ps.poll() is None  # the ps waits for a chief to end the run
        chief = tasks.start("worker", 0)
        tasks.wait_for_line("worker0", "the ps kept the variables", timeout=120)
        resumed = [l for _, l in tasks.lines["worker0"] if "the ps kept the variables" in l][0]
        assert int(resumed.split("global step ")[1].split(":")[0]) >= last_seen, resumed
        assert chief.wait(timeout=180) == 0, tasks.output("worker0")
        assert other.wait(timeout=60) == 0 and ps.wait(timeout=30) == 0, tasks.output("ps0")
        summary = [l for _, l in tasks.lines["worker0"] if "] summary " in l][-1]
        assert "lost_workers=0" in summary, summary
        assert float(summary.split("test_accuracy=")[1].split()[0]) >= ACCURACY_BAR
    finally:
        tasks.stop_all()
    assert_nothing_left(str(tmp_path))


@pytest.mark.restarts
def test_a_parameter_server_killed_and_restarted_is_restored_by_the_chief_and_the_run_ends(
        tmp_path):
    # the new ps has no variables and no record of the run: the chief notices at its next step,
    # restores its last checkpoint and writes the record back; both workers take up the run again
    tasks = Tasks(tmp_path, 2, "--steps", "20000", "--log_every", "200")
    try:
        ps, chief, other = tasks.start("ps"), tasks.start("worker", 0), tasks.start("worker", 1)
        deadline = time.time() + 150  # the chief's first checkpoint comes after 30 s
        while not os.path.exists(tmp_path / "logs" / "checkpoint") and time.time() < deadline:
            assert chief.poll() is None, tasks.output("worker0")
            time.sleep(0.5)
        assert os.path.exists(tmp_path / "logs" / "checkpoint"), tasks.output("worker0")
        ps.kill()
        ps.wait()
        ps = tasks.start("ps")
        tasks.wait_for_line("worker0", "resuming from the checkpoint at global step", timeout=120)
        assert chief.wait(timeout=240) == 0, tasks.output("worker0")
        assert other.wait(timeout=60) == 0, tasks.output("worker1")
        assert ps.wait(timeout=30) == 0, tasks.output("ps0")
        assert "[ps0] the run is over; shutting down" in tasks.output("ps0")
        for role in ("worker0", "worker1"):  # each lost a step, and said so in a line
            assert "lost a step to a restart" in tasks.output(role), tasks.output(role)
        summary = [l for _, l in tasks.lines["worker0"] if "] summary " in l][-1]
        assert "lost_workers=0" in summary, summary  # the record came back with the chief
        assert float(summary.split("test_accuracy=")[1].split()[0]) >= ACCURACY_BAR
    finally:
        tasks.stop_all()
    assert_nothing_left(str(tmp_path))


def test_a_worker_whose_step_never_returns_exits_after_the_watchdogs_time(tmp_path):
    # a stopped ps answers nothing: the chief's step waits forever, and only ending the process
    # bounds that; a restart policy would then start it again
    tasks = Tasks(tmp_path, 1, "--steps", "1000000", "--log_every", "100", "--watchdog", "5")
    try:
        ps, chief = tasks.start("ps"), tasks.start("worker", 0)
        tasks.wait_for_line("worker0", "local_step=100", timeout=120)
        ps.send_signal(signal.SIGSTOP)
        stopped_at = time.time()
        assert chief.wait(timeout=60) == 2, tasks.output("worker0")
        assert 5 <= time.time() - stopped_at < 30
        assert tasks.lines["worker0"][-1][1] == ("error: worker0 completed no step for 5 s "
                                                 "(--watchdog): exiting, so that it can be "
                                                 "restarted")
    finally:
        for proc in tasks.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
        tasks.stop_all()
    assert_nothing_left(str(tmp_path))


# --- Bad input: one clear line and a non-zero exit ------------------------------------------------
def cluster(ps=None, workers=None):
    return ["--ps_hosts", "localhost:%d" % (ps or free_port()),
            "--worker_hosts", ",".join("localhost:%d" % (w or free_port()) for w in
                                       (workers or [None]))]


@pytest.mark.parametrize("args, message", [
    (["--job_name", "chef"] + cluster(), "unknown job name 'chef': use ps or worker"),
    (["--job_name", "worker", "--task_index", "2"] + cluster(workers=[None, None]),
     "task index 2 is out of range: the worker job has 2 task(s), 0..1"),
    (["--job_name", "ps", "--ps_hosts", "localhost", "--worker_hosts", "localhost:1"],
     "ps hosts: 'localhost' is not host:port"),
    (["--job_name", "worker", "--ps_hosts", "localhost:1", "--worker_hosts", "a:2,,b:3"],
     "worker hosts: '' is not host:port"),
    (["--job_name", "worker", "--datapath", "x.npz"] + cluster(), "unrecognized arguments"),
    (["--job_name", "worker", "--steps", "0"] + cluster(), "--steps must be positive, got 0"),
    (["--job_name", "worker", "--steps", "many"] + cluster(), "invalid int value: 'many'"),
    (["--job_name", "worker", "--learning_rate", "-1"] + cluster(), "--learning_rate must be"),
    (["--job_name", "worker", "--task_index", "-1"] + cluster(), "--task_index must be 0 or"),
])
def test_bad_input_gets_one_clear_line_and_a_non_zero_exit_before_tensorflow_loads(args, message):
    code, _, stderr, tensorflow_loaded = run_train_noting_tensorflow("Distributed-Setup", args)
    assert code == 2
    assert stderr.splitlines() == error_lines(stderr), "only our line, no start-up noise"
    assert len(error_lines(stderr)) == 1 and message in error_lines(stderr)[0], stderr
    assert not tensorflow_loaded, "TensorFlow was loaded before the flags were checked"


def test_a_port_already_in_use_is_reported(tmp_path):
    busy = socket.socket()
    busy.bind(("", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        code, _, stderr = run_train("Distributed-Setup", ["--job_name", "ps"] + cluster(ps=port))
    finally:
        busy.close()
    assert code == 2 and "ps 0: port localhost:%d is already in use" % port in stderr, stderr
    assert "Traceback" not in stderr


def test_an_unreachable_parameter_server_is_reported_after_the_timeout():
    started = time.time()
    code, _, stderr = run_train("Distributed-Setup", ["--job_name", "worker",
                                                      "--connect_timeout", "2"] + cluster())
    assert code == 2 and "cannot reach the ps at localhost:" in stderr, stderr
    assert time.time() - started < 30
    assert "Traceback" not in stderr


def test_a_malformed_tf_config_is_reported():
    code, _, stderr = run_train("Distributed-Setup", [], env={"TF_CONFIG": "{not json"})
    assert code == 2 and "TF_CONFIG is not valid cluster JSON" in stderr, stderr


def test_run_sh_rejects_a_bad_worker_count(tmp_path):
    run = finish(start_example("Distributed-Setup", ["--log_dir", str(tmp_path)],
                               env={"NUM_WORKERS": "two"}), timeout=30)
    assert run.code == 2 and "NUM_PS and NUM_WORKERS must be positive integers" in run.output


# --- Cluster from flags or TF_CONFIG --------------------------------------------------------------
def parse(argv):
    train = load_train_module("Distributed-Setup")
    args = train.parse_flags(argv, train.example_flags)
    cluster = train.resolve_cluster(args)
    return cluster, args.job_name, args.task_index


def test_the_cluster_comes_from_the_flags(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    cluster, job, index = parse(["--job_name", "worker", "--task_index", "1", "--ps_hosts",
                                 "h0:2222", "--worker_hosts", "h1:2222, h2:2222"])
    assert cluster == {"ps": ["h0:2222"], "worker": ["h1:2222", "h2:2222"]}
    assert (job, index) == ("worker", 1)


def test_tf_config_is_read_when_no_cluster_flags_are_given(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"ps": ["ps-0:2222"], "worker": ["w-0:2222", "w-1:2222"]},
        "task": {"type": "worker", "index": 1}, "environment": "cloud"}))
    assert parse([]) == ({"ps": ["ps-0:2222"], "worker": ["w-0:2222", "w-1:2222"]}, "worker", 1)


def test_a_tf_config_chief_becomes_worker_0_and_the_workers_follow(monkeypatch):
    spec = {"chief": ["c:2222"], "ps": ["p:2222"], "worker": ["w0:2222", "w1:2222"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": spec, "task": {"type": "chief"}}))
    cluster, job, index = parse([])
    assert cluster["worker"] == ["c:2222", "w0:2222", "w1:2222"] and (job, index) == ("worker", 0)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": spec,
                                                "task": {"type": "worker", "index": 1}}))
    assert parse([])[1:] == ("worker", 2)


@pytest.mark.parametrize("task, expected", [
    ({"type": "master", "index": 0}, ("worker", 0)),  # SageMaker and old Cloud ML name the chief so
    ({"type": "worker", "index": 0}, ("worker", 1)),
    ({"type": "ps", "index": 0}, ("ps", 0)),
])
def test_tf_config_as_operators_write_it_with_master_evaluator_and_environment(
        monkeypatch, task, expected):
    spec = {"master": ["m:2222"], "ps": ["p:2222"], "worker": ["w0:2222"],
            "evaluator": ["e:2222"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": spec, "task": task,
                                                "environment": "cloud", "rpc_layer": "grpc"}))
    cluster, job, index = parse([])
    assert cluster == {"ps": ["p:2222"], "worker": ["m:2222", "w0:2222"]}  # no evaluator
    assert (job, index) == expected


def test_an_evaluator_task_has_nothing_to_do_and_exits_cleanly():
    spec = {"chief": ["c:2222"], "ps": ["p:2222"], "evaluator": ["e:2222"]}
    code, stdout, stderr = run_train("Distributed-Setup", [], env={"TF_CONFIG": json.dumps(
        {"cluster": spec, "task": {"type": "evaluator", "index": 0}})}, timeout=30)
    assert code == 0 and "nothing to do" in stdout and not error_lines(stderr), stderr


def test_cluster_flags_win_over_tf_config(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"ps": ["x:1"], "worker": ["y:1"]},
                                                "task": {"type": "ps", "index": 0}}))
    assert parse(["--job_name", "worker", "--ps_hosts", "a:1", "--worker_hosts", "b:1"]) == (
        {"ps": ["a:1"], "worker": ["b:1"]}, "worker", 0)


# --- Data -----------------------------------------------------------------------------------------
def test_the_digits_split_is_fixed_and_disjoint():
    train = load_train_module("Distributed-Setup")
    a, b = train.load_dataset(), train.load_dataset()
    assert np.array_equal(a.x_test, b.x_test) and len(a.x_train) + len(a.x_test) == 1797
    train_rows = set(map(bytes, a.x_train))
    assert sum(bytes(r) in train_rows for r in a.x_test) < 0.05 * len(a.x_test)  # few duplicates


def write_tiny_mnist(path, train, test, seed):
    """An .npz shaped like MNIST (28x28 uint8 images, labels 0-9) with random content."""
    rng = np.random.default_rng(seed)
    np.savez(path, x_train=rng.integers(0, 256, (train, 28, 28), dtype=np.uint8),
             y_train=rng.integers(0, 10, train),
             x_test=rng.integers(0, 256, (test, 28, 28), dtype=np.uint8),
             y_test=rng.integers(0, 10, test))


def test_images_of_your_own_load_from_an_npz_shaped_like_mnist(tmp_path):
    train = load_train_module("Distributed-Setup")
    path = tmp_path / "mnist.npz"
    write_tiny_mnist(path, train=50, test=20, seed=0)
    data = train.load_dataset(str(path))
    assert data.x_train.shape == (50, 28, 28, 1) and data.x_test.shape == (20, 28, 28, 1)
    assert data.x_train.dtype == np.float32 and data.y_train.dtype == np.int64
    with np.load(path) as f:  # integer pixels scaled by the largest: 255 here
        np.testing.assert_allclose(data.x_train[..., 0], f["x_train"] / f["x_train"].max(),
                                   rtol=1e-6)


def test_an_npz_of_your_own_trains_end_to_end(run_example, tmp_path):
    path = tmp_path / "tiny.npz"
    write_tiny_mnist(path, train=256, test=64, seed=1)
    run = run_example("Distributed-Setup", "--data_path", str(path),
                      "--steps", "20", env={"NUM_WORKERS": "1"})
    assert run.code == 0, run.output[-3000:]
    assert run.summary()["global_step"] == "20"


def batches_of(train, worker, num_workers, n):
    """The first n batches that one worker's pipeline yields, as sets of example ids."""
    import tensorflow as tf
    ids = np.arange(400)
    x = ids.reshape(-1, 1).astype(np.float32)  # the example's id as its one feature
    data = train.Dataset(x, ids, x[:1], ids[:1])
    with tf.Graph().as_default():
        _, y = train.training_batches(data, 32, worker, num_workers, seed=0)
        with tf.compat.v1.Session() as s:
            return [frozenset(s.run(y).tolist()) for _ in range(n)]


def test_each_worker_draws_its_own_batches_and_every_step_sees_a_new_one():
    train = load_train_module("Distributed-Setup")
    worker0, worker1 = batches_of(train, 0, 2, 12), batches_of(train, 1, 2, 12)
    assert not set().union(*worker0) & set().union(*worker1), "the workers' shards overlap"
    for batches in (worker0, worker1):
        assert len(set(batches)) == len(batches), "a batch came twice"
        epoch = 200 // 32
        assert len(set().union(*batches[:epoch])) == epoch * 32, "an epoch repeats an example"



# --- Errors from TensorFlow: the line that says what went wrong -----------------------------------
def test_a_tensorflow_error_is_reported_by_its_cause_not_its_node_or_trace():
    import tensorflow as tf
    train = load_train_module("Distributed-Setup")
    error = tf.errors.AbortedError(None, None, "Graph execution error:\n\nDetected at node 'x' "
                                   "defined at (most recent call last):\n  File \"train.py\", "
                                   "line 1\nNode: 'x'\nthe step was aborted\n\t [[{{node x}}]]")
    assert train.cause(error) == "the step was aborted"
    assert train.cause(tf.errors.UnavailableError(None, None, "Socket closed")) == "Socket closed"
    assert train.cause(tf.errors.UnavailableError(None, None, "Connection reset by peer\n"
                                                  "=====================")) == (
        "Connection reset by peer")  # a rule says nothing


@pytest.mark.parametrize("example", ["Distributed-Setup", "Sync-SGD"])
def test_shard_variables_puts_an_equal_slice_of_every_variable_on_each_ps(example):
    import tensorflow as tf
    module = load_train_module(example)
    cluster = {"ps": ["localhost:1", "localhost:2", "localhost:3"], "worker": ["localhost:4"]}
    build = module.build_async_sgd if example == "Distributed-Setup" else module.build_sync_sgd
    for shard in (False, True):
        args = module.parse_flags(["--hidden", "30"] + ["--shard_variables"] * shard,
                                  module.example_flags)
        with tf.Graph().as_default():
            built = build(args, cluster, tf.zeros([4, 64]), tf.zeros([4], tf.int64))
            bytes_on = {ps: 0 for ps in range(3)}
            for name, variable in built.global_params.items():
                parts = list(variable) if shard else [variable]
                ps_tasks = sorted(int(part.device.split("task:")[1]) for part in parts)
                assert ps_tasks == ([0, 1, 2] if shard else ps_tasks[:1]), (name, ps_tasks)
                for part in parts:
                    bytes_on[int(part.device.split("task:")[1])] += 4 * part.shape.num_elements()
        mean = sum(bytes_on.values()) / 3
        spread = max(abs(b - mean) / mean for b in bytes_on.values())
        if shard:  # every ps within 10% of the mean; whole variables load one ps with most
            assert spread < 0.1, bytes_on
        else:
            assert spread > 0.5, bytes_on

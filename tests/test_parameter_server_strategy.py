"""ParameterServerStrategy: a coordinator schedules steps onto workers; variables on the ps, in
shards over several ps; each worker reads its own shard, in an order of its own that a resumed
run does not replay; a lost worker's work moves to the others; every process ends by itself, and
a cluster that never starts ends in one line."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from support.examples import (ACCURACY_BAR, environment_without_tf_config, error_lines,
                              example_dir, run_train, run_train_noting_tensorflow)
from support.processes import assert_nothing_left, free_ports
from support.runs import finish, read_until, scalars, start_example, started_pid
from support.strategies import (assert_a_resumed_run_reads_its_data_in_an_order_of_its_own,
                                assert_one_sgd_step_of, one_strategy_step)

EXAMPLE = "ParameterServerStrategy"


@pytest.mark.rule
def test_a_scheduled_step_moves_the_parameters_by_the_learning_rate_times_the_gradient():
    # one worker, one call of one step, a mini-batch that is the worker's whole shard
    ports = ",".join(map(str, free_ports(3)))
    (step,) = one_strategy_step(EXAMPLE, ports)
    assert_one_sgd_step_of(step, EXAMPLE, learning_rate=0.1)


@pytest.mark.rule
def test_each_worker_reads_its_own_shard_and_no_example_is_read_by_both():
    # two workers, a mini-batch the size of a shard: whichever worker a call lands on, it
    # reads its whole shard, reshuffled; the two shards share no example and cover them all
    ports = ",".join(map(str, free_ports(4)))
    (step,) = one_strategy_step("ParameterServerStrategy-two-workers", ports)
    scaled = step["x"]  # the features as the model takes them
    index_of = {row.tobytes(): i for i, row in enumerate(scaled)}
    assert len(index_of) == len(scaled), "two examples alike: the test cannot tell them apart"
    read = {0: set(), 1: set()}
    for worker, batch in zip(step["worker"], step["batches"]):
        rows = {index_of[row.tobytes()] for row in batch}
        assert len(rows) == len(batch)  # a whole shard, each example once
        read[int(worker)] |= rows
    assert read[0] and read[1], "the coordinator used one worker only: %s" % step["worker"]
    assert not read[0] & read[1], "examples read by both workers: %s" % sorted(read[0] & read[1])
    assert read[0] | read[1] == set(range(len(scaled)))


def test_a_resumed_run_or_a_restarted_worker_reads_its_shard_in_an_order_of_its_own():
    # the dataset function mixes in the global step as a worker makes its dataset: at the
    # run's start, after a resume, and when the coordinator makes it again for a restarted worker
    assert_a_resumed_run_reads_its_data_in_an_order_of_its_own(EXAMPLE)


def test_the_coordinator_schedules_every_step_on_one_of_the_two_workers(default_runs):
    # the bar, and every process ending by itself: test_examples_end_to_end.py
    run = default_runs[EXAMPLE]
    summary = run.summary()
    assert summary["global_step"] == "2000"
    # local_steps: the mini-batches each worker's shard gave, which sum to the global step
    local_steps = [int(s) for s in summary["local_steps"].split(",")]
    assert len(local_steps) == 2 and sum(local_steps) == 2000 and min(local_steps) > 0
    written = scalars(run.log_dir)  # the chief's TensorBoard scalars at every progress line
    assert [s for _, s, _ in written["loss"]] == list(range(100, 2001, 100)), written["loss"]


def test_with_two_ps_the_large_variable_is_split_over_both(run_example):
    run = run_example(EXAMPLE, "--steps", "200", env={"NUM_PS": "2"}, timeout=240)
    assert run.code == 0, run.output[-3000:]
    w1 = [l for l in run.output.splitlines() if l.startswith("[chief0] w1 [64, 128] on ")]
    assert w1 and sorted(w1[0].split(" on ")[1].split(", ")) == [
        "/job:ps/replica:0/task:0", "/job:ps/replica:0/task:1"], run.output[-3000:]


def test_a_killed_worker_does_not_stop_the_coordinator(tmp_path):
    proc = start_example(EXAMPLE, ["--log_dir", str(tmp_path / "logs"), "--steps", "6000"])
    seen = read_until(proc, "[chief0] global_step=", timeout=120)
    os.kill(started_pid(seen, "worker1"), signal.SIGKILL)
    run = finish(proc, timeout=180)
    summary = run.summary()  # the other worker did the rest
    assert summary["global_step"] == "6000" and summary["lost_workers"] == "1"
    assert float(summary["test_accuracy"]) >= ACCURACY_BAR
    assert run.code == 1 and "[run.sh] failed: worker1 (exit 137)" in run.output
    assert_nothing_left(str(tmp_path))


def test_bad_input_fails_in_one_line_before_tensorflow_loads():
    hosts = ["--ps_hosts", "localhost:1", "--worker_hosts", "localhost:2", "--chief_host",
             "localhost:3"]
    code, _, stderr, tensorflow_loaded = run_train_noting_tensorflow(
        EXAMPLE, ["--job_name", "evaluator"] + hosts)
    assert code == 2 and error_lines(stderr) == [
        "error: unknown job name 'evaluator': use chief or worker or ps"]
    assert not tensorflow_loaded
    code, _, stderr, tensorflow_loaded = run_train_noting_tensorflow(
        EXAMPLE, ["--job_name", "worker", "--task_index", "1"] + hosts)
    assert code == 2 and error_lines(stderr) == [
        "error: task index 1 is out of range: the worker job has 1 task(s), 0..0"]
    assert not tensorflow_loaded
    code, _, stderr = run_train(EXAMPLE, ["--job_name", "ps", "--ps_hosts", "localhost"])
    assert code == 2 and len(error_lines(stderr)) == 1


def test_a_server_whose_coordinator_never_comes_ends_with_one_line():
    port, worker_port, chief_port = free_ports(3)
    code, _, stderr = run_train(EXAMPLE, [
        "--job_name", "ps", "--ps_hosts", "localhost:%d" % port, "--worker_hosts",
        "localhost:%d" % worker_port, "--chief_host", "localhost:%d" % chief_port,
        "--connect_timeout", "2"])
    assert code == 2
    assert error_lines(stderr)[-1].startswith("error: ps0: localhost:") and "did not come up " \
        "within 2 s" in stderr


def test_with_every_worker_killed_the_coordinator_ends_the_run_in_one_line(tmp_path):
    proc = start_example(EXAMPLE, ["--log_dir", str(tmp_path / "logs"), "--steps", "200000",
                                   "--connect_timeout", "10"])
    seen = read_until(proc, "[chief0] global_step=", timeout=120)
    for worker in ("worker0", "worker1"):
        os.kill(started_pid(seen, worker), signal.SIGKILL)
    killed_at = time.time()
    run = finish(proc, timeout=90)
    assert run.code == 1 and time.time() - killed_at < 60, run.output[-3000:]
    assert "[chief0] error: chief 0 stopped: no worker has answered for 10 s" in run.output
    assert "resume from" in run.output  # run.sh names the command that resumes
    assert_nothing_left(str(tmp_path))


def start_a_ps(coordinator, connect_timeout):
    """A ps of this example started by hand, its coordinator at the address coordinator; its
    output lines are collected (with their arrival times) as they come."""
    ps, worker = free_ports(2)
    proc = subprocess.Popen(
        [sys.executable, os.path.join(example_dir(EXAMPLE), "train.py"), "--job_name", "ps",
         "--ps_hosts", "localhost:%d" % ps, "--worker_hosts", "localhost:%d" % worker,
         "--chief_host", coordinator, "--connect_timeout", str(connect_timeout)],
        env=environment_without_tf_config({"PYTHONUNBUFFERED": "1"}), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    proc.lines = []
    proc.reader = threading.Thread(target=lambda: proc.lines.extend(
        (time.time(), line) for line in proc.stdout), daemon=True)
    proc.reader.start()
    return proc


def arrival(proc, text, timeout):
    """When proc printed its first line with text: at most timeout seconds from now."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        ended = proc.poll() is not None
        if ended:
            proc.reader.join(5)  # its last lines
        found = [t for t, line in list(proc.lines) if text in line]
        if found or ended:
            break
        time.sleep(0.1)  # the pace of the checks
    assert found, "no %r within %d s: %s" % (text, timeout, "".join(l for _, l in proc.lines))
    return found[0]


def serve(server):
    """Accept and close connections until the server socket is closed."""
    try:
        while True:
            server.accept()[0].close()
    except OSError:
        return


def test_a_server_takes_a_refused_coordinator_for_gone_at_once_and_an_unanswered_one_later():
    # at 20 Mbit/s the coordinator's start-up filled its link, a connection to it went
    # unanswered for a second, and a ps that took that for the end shut down under a new run
    answering = socket.create_server(("localhost", 0))  # the coordinator: up, then gone
    threading.Thread(target=serve, args=(answering,), daemon=True).start()
    silent = socket.create_server(("localhost", 0), backlog=0)  # one that stops answering:
    # nobody accepts, so the first connection fills its backlog and the next go unanswered
    procs = [start_a_ps("localhost:%d" % s.getsockname()[1], 6) for s in (answering, silent)]
    try:
        up = [arrival(proc, "is done", timeout=120) for proc in procs]
        time.sleep(1)
        answering.close()
        closed = time.time()
        gone = [arrival(proc, "is gone; shutting down", timeout=60) for proc in procs]
        assert gone[0] - closed < 5  # refused: gone at once
        assert 6 <= gone[1] - up[1] < 30  # unanswered: after --connect_timeout of it
        assert [proc.wait(timeout=30) for proc in procs] == [0, 0]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        silent.close()


def test_a_port_already_in_use_is_one_line():
    taken = socket.create_server(("localhost", 0))
    port = taken.getsockname()[1]
    code, _, stderr = run_train(EXAMPLE, ["--job_name", "ps", "--ps_hosts", "localhost:%d" % port,
                                          "--worker_hosts", "localhost:1", "--chief_host",
                                          "localhost:2"])
    taken.close()
    assert code == 2 and error_lines(stderr) == [
        "error: ps 0 stopped: port localhost:%d is already in use: by an earlier run, or another "
        "program?" % port], stderr


def test_a_coordinator_whose_cluster_never_starts_names_the_silent_tasks_in_one_line():
    # the strategy's own start waits an hour for a task that never comes
    ps, worker, chief = free_ports(3)
    started = time.time()
    code, _, stderr = run_train(EXAMPLE, [
        "--job_name", "chief", "--ps_hosts", "localhost:%d" % ps, "--worker_hosts",
        "localhost:%d" % worker, "--chief_host", "localhost:%d" % chief, "--connect_timeout",
        "3"], timeout=120)
    assert code == 2 and time.time() - started < 100, stderr
    (line,) = error_lines(stderr)
    assert line.startswith("error: chief 0 stopped: the cluster has not started within 3 s; "
                           "silent: "), line
    silent = line.split("silent: ")[1].split(",")
    assert {"localhost:%d" % ps, "localhost:%d" % worker} <= set(silent), line


def test_an_evaluator_task_is_refused_in_one_line_that_says_what_to_do():
    config = {"cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"],
                          "ps": ["localhost:3"], "evaluator": ["localhost:4"]},
              "task": {"type": "evaluator", "index": 0}}
    code, _, stderr = run_train(EXAMPLE, [], env={"TF_CONFIG": json.dumps(config)})
    assert code == 2
    assert error_lines(stderr) == ["error: an evaluator task is not needed here: the chief "
                                   "evaluates; remove it from TF_CONFIG"]

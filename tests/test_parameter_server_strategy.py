"""ParameterServerStrategy: a coordinator schedules steps onto workers; variables on the ps, in
shards over several ps; a lost worker's work moves to the others; every process ends by itself."""
import json
import os
import signal
import socket
import time

import pytest

from support.examples import (ACCURACY_BAR, error_lines, load_train_module, run_train,
                              run_train_noting_tensorflow)
from support.processes import assert_nothing_left, free_ports
from support.runs import finish, read_until, start_example, started_pid
from support.strategies import assert_one_sgd_step_of, one_strategy_step

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


def test_the_coordinator_schedules_every_step_on_one_of_the_two_workers(default_runs):
    # the bar, and every process ending by itself: test_examples_end_to_end.py
    summary = default_runs[EXAMPLE].summary()
    assert summary["global_step"] == "2000"
    local_steps = [int(s) for s in summary["local_steps"].split(",")]
    assert len(local_steps) == 2 and sum(local_steps) == 2000 and min(local_steps) > 0


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


def test_a_server_takes_a_refused_coordinator_for_gone_at_once_and_an_unanswered_one_only_later(
        monkeypatch):
    # at 20 Mbit/s the coordinator's start-up filled its link, a connection to it went
    # unanswered for a second, and the ps shut down under a run that had just started
    train = load_train_module(EXAMPLE)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    address = "127.0.0.1:%d" % listener.getsockname()[1]
    gone = train.is_gone(address, silence=0.5)
    assert not gone()  # it answers
    unanswered = lambda *args, **kwargs: (_ for _ in ()).throw(socket.timeout("timed out"))
    with monkeypatch.context() as patched:
        patched.setattr(train.socket, "create_connection", unanswered)
        assert not gone()  # no answer: not yet gone
        time.sleep(0.6)
        assert gone()  # no answer for longer than silence: gone
    gone = train.is_gone(address, silence=0.5)
    with monkeypatch.context() as patched:
        patched.setattr(train.socket, "create_connection", unanswered)
        assert not gone()
    assert not gone()  # it answered again: the silence starts over
    listener.close()
    assert gone()  # refused: gone at once


def test_an_evaluator_task_is_refused_in_one_line_that_says_what_to_do():
    config = {"cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"],
                          "ps": ["localhost:3"], "evaluator": ["localhost:4"]},
              "task": {"type": "evaluator", "index": 0}}
    code, _, stderr = run_train(EXAMPLE, [], env={"TF_CONFIG": json.dumps(config)})
    assert code == 2
    assert error_lines(stderr) == ["error: an evaluator task is not needed here: the chief "
                                   "evaluates; remove it from TF_CONFIG"]

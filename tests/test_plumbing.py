"""The plumbing every example shares (the appendix below each train.py's banner), tested on its
reference copy, Distributed-Setup's: the flags and the cluster from them or from TF_CONFIG, bad
input in one line, --data_path's file and the data pipeline, a TensorFlow error by its cause,
variables sharded over the ps; and a cluster's tasks started one by one: a ps no chief reaches,
a late worker, a chief or a ps that restarts, a worker whose step never returns (the watchdog).
test_boilerplate.py checks that every other train.py carries the same text."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from support.examples import (ACCURACY_BAR, environment_without_tf_config, error_lines,
                              example_dir, load_train_module, run_train,
                              run_train_noting_tensorflow)
from support.processes import assert_nothing_left, free_port
from support.runs import Tasks

EXAMPLE = "Distributed-Setup"


# --- Flags ----------------------------------------------------------------------------------------
def test_the_default_log_dir_is_new_for_every_run(tmp_path):
    train = load_train_module("Distributed-Setup")
    first = train.parse_flags([], train.example_flags).log_dir
    time.sleep(1.1)  # the folder name has one-second resolution plus the process id
    assert train.parse_flags([], train.example_flags).log_dir != first


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
    (["--job_name", "worker", "--steps", "many"] + cluster(), "invalid positive_int value: 'many'"),
    (["--job_name", "worker", "--learning_rate", "-1"] + cluster(), "--learning_rate must be"),
    (["--job_name", "worker", "--task_index", "-1"] + cluster(), "--task_index must be 0 or"),
])
def test_bad_input_gets_one_clear_line_and_a_non_zero_exit_before_tensorflow_loads(args, message):
    code, _, stderr, tensorflow_loaded = run_train_noting_tensorflow("Distributed-Setup", args)
    assert code == 2
    assert stderr.splitlines() == error_lines(stderr), "only our line, no start-up noise"
    assert len(error_lines(stderr)) == 1 and message in error_lines(stderr)[0], stderr
    assert not tensorflow_loaded, "TensorFlow was loaded before the flags were checked"


@pytest.mark.parametrize("holder", ["a listener", "a client's connection"])
def test_a_port_already_in_use_is_reported(holder):
    """Also a port no one listens on but a client's connection holds (the kernel hands out the
    same ports to clients): gRPC then cannot bind it, and used to end in a traceback."""
    server = socket.socket()
    server.bind(("localhost", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname()) if holder != "a listener" else None
    busy = client or server
    port = busy.getsockname()[1]
    try:
        code, _, stderr = run_train("Distributed-Setup", ["--job_name", "ps"] + cluster(ps=port))
    finally:
        for s in (client, server):
            s and s.close()
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
    # integer pixels stay a byte each in memory, and the pipeline scales them by the largest
    import tensorflow as tf
    train = load_train_module("Distributed-Setup")
    path = tmp_path / "mnist.npz"
    write_tiny_mnist(path, train=50, test=20, seed=0)
    data = train.load_dataset(str(path))
    assert data.x_train.shape == (50, 28, 28, 1) and data.x_test.shape == (20, 28, 28, 1)
    assert data.x_train.dtype == np.uint8 and data.y_train.dtype == np.int64
    with np.load(path) as f:
        assert data.x_scale == f["x_train"].max() == 255
        expected = sorted(f["x_train"].reshape(50, -1).sum(axis=1) / 255)
    with tf.Graph().as_default():
        x, _ = train.training_batches(data, 50, 0, 1, seed=0)
        with tf.compat.v1.Session() as session:
            train.start_the_data(session, 0)
            batch = session.run(x)
    assert batch.dtype == np.float32 and batch.shape == (50, 28, 28, 1)
    np.testing.assert_allclose(sorted(batch.reshape(50, -1).sum(axis=1)), expected, rtol=1e-5)


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
    data = train.Dataset(x, ids, x[:1], ids[:1], num_classes=400)
    with tf.Graph().as_default():
        _, y = train.training_batches(data, 32, worker, num_workers, seed=0)
        with tf.compat.v1.Session() as s:
            train.start_the_data(s, 0)
            return [frozenset(s.run(y).tolist()) for _ in range(n)]


def test_each_worker_draws_its_own_batches_and_every_step_sees_a_new_one():
    train = load_train_module("Distributed-Setup")
    worker0, worker1 = batches_of(train, 0, 2, 12), batches_of(train, 1, 2, 12)
    assert not set().union(*worker0) & set().union(*worker1), "the workers' shards overlap"
    for batches in (worker0, worker1):
        assert len(set(batches)) == len(batches), "a batch came twice"
        epoch = 200 // 32
        assert len(set().union(*batches[:epoch])) == epoch * 32, "an epoch repeats an example"


# --- The chief's test metrics ---------------------------------------------------------------------
@pytest.mark.rule
def test_the_test_metrics_are_means_over_every_example_each_batch_weighed_by_its_size():
    # 2500 examples: batches of 1000, 1000 and an uneven 500. A quarter of the first 2000 are
    # right and all of the last 500, so the accuracy is 1000 / 2500 = 0.4 (not the mean of the
    # batches' means, 0.5, nor 1500 / 2500 with the last batch counted as 1000 examples)
    import tensorflow as tf
    train = load_train_module("Distributed-Setup")
    count = 2500
    right = (np.arange(count) >= 2000) | (np.arange(count) % 4 == 0)
    labels = np.arange(count) % 10
    guesses = np.where(right, labels, (labels + 1) % 10)
    x_test, y_test = np.eye(10, dtype=np.float32)[guesses], labels  # a guess: a one-hot row
    data = train.Dataset(x_test[:1], y_test[:1], x_test, y_test, num_classes=10)
    with tf.Graph().as_default():
        def metrics(x, y):
            return {"accuracy": tf.reduce_mean(tf.cast(tf.equal(tf.argmax(x, 1), y), tf.float32)),
                    "guess": tf.reduce_mean(tf.cast(tf.argmax(x, 1), tf.float32))}
        test_set = train.test_metrics_of(metrics, data)
        with tf.compat.v1.Session() as session:
            got = train.mean_over_the_test_set(session, *test_set)
    assert got == {"accuracy": pytest.approx(right.mean(), abs=1e-6),
                   "guess": pytest.approx(guesses.mean(), abs=1e-5)}
    assert right.mean() == pytest.approx(0.4)


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
    for shard in (False, True):
        args = module.parse_flags(["--hidden", "30"] + ["--shard_variables"] * shard,
                                  module.example_flags)
        with tf.Graph().as_default():
            x, y = tf.zeros([4, 64]), tf.zeros([4], tf.int64)
            if example == "Distributed-Setup":  # the scopes its train() builds build_sgd in
                with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
                        cluster=cluster, worker_device="/job:worker/task:0")), \
                        module.sharded_over_the_ps(cluster, args.shard_variables):
                    params = module.build_sgd(args, x, y).params
            else:
                params = module.build_sync_sgd(args, cluster, x, y).global_params
            bytes_on = {ps: 0 for ps in range(3)}
            for name, variable in params.items():
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


# --- A real cluster: tasks that start late, a chief that restarts ---------------------------------
def test_a_parameter_server_that_no_chief_reaches_ends_with_one_line_and_a_failure():
    chief = free_port()
    code, _, stderr = run_train("Distributed-Setup", ["--job_name", "ps", "--connect_timeout",
                                                      "2"] + cluster(workers=[chief]))
    assert code == 2
    assert error_lines(stderr) == ["error: ps0: no chief at localhost:%d within 2 s: this ps "
                                   "served no one" % chief]


def test_a_parameter_server_waits_on_for_a_chief_that_listens_while_it_builds_its_graph():
    # a chief whose port is open has started: it may take minutes to build a large graph. Here
    # a socket stands for it, open for 8 s, four times --connect_timeout: the ps must wait
    # while it listens, and give up only once it has closed
    chief = socket.socket()
    chief.bind(("localhost", 0))
    chief.listen(8)
    port = chief.getsockname()[1]
    started = time.time()
    ps = subprocess.Popen([sys.executable, os.path.join(example_dir("Distributed-Setup"),
                                                        "train.py"),
                           "--job_name", "ps", "--connect_timeout", "2"] + cluster(
                               workers=[port]), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=environment_without_tf_config())
    try:
        time.sleep(8)  # the chief's lifetime, not a wait for a result
        assert ps.poll() is None, "the ps gave up on a chief that listens: %s" % ps.stderr.read()
        chief.close()
        _, stderr = ps.communicate(timeout=30)
    finally:
        chief.close()
        if ps.poll() is None:
            ps.kill()
            ps.wait()
    assert ps.returncode == 2 and time.time() - started > 8
    assert error_lines(stderr) == ["error: ps0: no chief at localhost:%d within 2 s: this ps "
                                   "served no one" % port]


def test_the_chief_waits_for_a_worker_that_starts_after_it_has_finished(tmp_path):
    # worker 1 starts only once the chief has trained the whole budget: it is not lost, it is
    # late; the ps ends only once the chief, having seen worker 1 finish, ends the run
    tasks = Tasks(EXAMPLE, tmp_path, 2, "--steps", "300", "--log_every", "100")
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
    tasks = Tasks(EXAMPLE, tmp_path, 2, "--steps", "3000", "--log_every", "50")
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
    tasks = Tasks(EXAMPLE, tmp_path, 2, "--steps", "20000", "--log_every", "200")
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
    tasks = Tasks(EXAMPLE, tmp_path, 1, "--steps", "1000000", "--log_every", "100",
                  "--watchdog", "5")
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


def test_the_watchdog_leaves_alone_a_worker_that_waits_for_its_ps_to_come_back(tmp_path):
    # --watchdog 3 s and a ps away for 8 s: the worker's new session waits for the ps (at most
    # --connect_timeout), which is no stuck step; once the ps is back, it rejoins and ends
    tasks = Tasks(EXAMPLE, tmp_path, 1, "--steps", "3000", "--log_every", "100",
                  "--watchdog", "3", "--connect_timeout", "30")
    try:
        ps, chief = tasks.start("ps"), tasks.start("worker", 0)
        tasks.wait_for_line("worker0", "local_step=100", timeout=120)
        ps.kill()
        ps.wait()
        time.sleep(8)  # the ps's outage, not a wait for a result
        assert chief.poll() is None, tasks.output("worker0")
        ps = tasks.start("ps")
        assert chief.wait(timeout=120) == 0, tasks.output("worker0")
        assert ps.wait(timeout=30) == 0, tasks.output("ps0")
        assert "lost a step to a restart" in tasks.output("worker0")
        assert "--watchdog" not in tasks.output("worker0")
    finally:
        tasks.stop_all()
    assert_nothing_left(str(tmp_path))

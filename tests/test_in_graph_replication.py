"""In-Graph-Replication: every tower gets its own slice of the mini-batch, the averaged gradient is
the whole mini-batch's, the towers run where they are placed (devices of one process, or worker
tasks), the tower count follows --devices, training matches one device, and every process ends
by itself, or in one line when a worker is lost. The plumbing of one client (its session, the
workers that serve it, their waits), which Model-Parallel-Pipeline shares, is tested here."""
import os
import signal
import socket
import time

import numpy as np
import pytest

from support.examples import error_lines, load_train_module, run_train
from support.in_process import fixed_batch, gradient_reference, values
from support.processes import assert_nothing_left, free_ports
from support.runs import (Tasks, finish, read_until, scalars, start_example, started_pid,
                          summary_of)

EXAMPLE = "In-Graph-Replication"


def towers_graph(module, cluster, *argv):
    """The example's towers on fixed_batch(16), in a graph of their own: (graph, towers, args)."""
    import tensorflow as tf
    args = module.parse_flags(["--hidden", "8"] + list(argv), module.example_flags)
    module.resolve_workers(args)
    graph = tf.Graph()
    with graph.as_default():
        devices, controller = module.run_devices(args, cluster)
        towers = module.build_towers(args, devices, controller, *fixed_batch(n=16))
        init = tf.compat.v1.global_variables_initializer()
    return graph, towers, init, args, devices


def traced_devices(session, fetch):
    """{device name: names of the ops that ran there} in one traced run of fetch."""
    import tensorflow as tf
    metadata = tf.compat.v1.RunMetadata()
    session.run(fetch, options=tf.compat.v1.RunOptions(
        trace_level=tf.compat.v1.RunOptions.FULL_TRACE), run_metadata=metadata)
    return {d.device: {n.node_name for n in d.node_stats} for d in metadata.step_stats.dev_stats}


def ran_on(trace, device_suffix, scope):
    """Whether an op of scope other than a read of a variable ran on the device (a read runs
    where its variable lives, and its value is then copied to the tower)."""
    return any(device.endswith(device_suffix) and any(
        n.startswith(scope + "/") and not n.endswith("/ReadVariableOp") for n in names)
        for device, names in trace.items())


# --- The algorithm, in this process -------------------------------------------------------------
@pytest.mark.rule
def test_each_tower_gets_its_own_slice_and_the_mean_gradient_is_the_whole_batchs():
    import tensorflow as tf
    module = load_train_module(EXAMPLE)
    graph, towers, init, args, devices = towers_graph(module, None, "--devices", "4")
    assert devices == ["/device:CPU:%d" % i for i in range(4)]
    with tf.compat.v1.Session(graph=graph, config=module.task_config(args)) as session:
        session.run(init)
        slices, per_tower, mean, params = session.run(
            [towers.x_slices, towers.tower_gradients, towers.mean_gradients, towers.params])
    batch = np.concatenate(slices)
    assert [len(s) for s in slices] == [4, 4, 4, 4]
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        np.testing.assert_array_equal(batch, session.run(fixed_batch(n=16)[0]))  # all of it
    rows = [set(map(bytes, np.asarray(s))) for s in slices]  # no example in two towers
    assert all(not rows[i] & rows[j] for i in range(4) for j in range(i + 1, 4))
    # each tower's gradient is its own (they were not fed the same batch) ...
    assert all(not np.allclose(per_tower[0][0], g[0]) for g in per_tower[1:])
    # ... and their mean is the gradient of the whole mini-batch, computed apart
    whole = gradient_reference(module, params)  # on the same fixed_batch(16)
    for name, g in zip(params, mean):
        np.testing.assert_allclose(g, whole[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.rule
def test_one_update_moves_the_parameters_by_the_whole_batchs_gradient():
    import tensorflow as tf
    module = load_train_module(EXAMPLE)
    graph, towers, init, args, _ = towers_graph(module, None, "--devices", "2")
    with tf.compat.v1.Session(graph=graph, config=module.task_config(args)) as session:
        session.run(init)
        before = values(session, towers.params)
        assert session.run(towers.step) == 1
        after = values(session, towers.params)
    whole = gradient_reference(module, before)
    for name in before:
        np.testing.assert_allclose(after[name], before[name] - args.learning_rate * whole[name],
                                   rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.rule
def test_each_tower_runs_on_its_own_device_and_the_update_on_the_controller():
    import tensorflow as tf
    module = load_train_module(EXAMPLE)
    graph, towers, init, args, _ = towers_graph(module, None, "--devices", "4")
    with tf.compat.v1.Session(graph=graph, config=module.task_config(args)) as session:
        session.run(init)
        trace = traced_devices(session, towers.step)
    for i in range(4):  # forward and backward of tower i on CPU:i
        assert ran_on(trace, "CPU:%d" % i, "tower%d" % i), (i, sorted(trace))
        assert not any(ran_on(trace, "CPU:%d" % j, "tower%d" % i) for j in range(4) if j != i)
    assert ran_on(trace, "CPU:0", "controller")
    assert {v.device for v in towers.params.values()} == {"/device:CPU:0"}


@pytest.mark.rule
def test_on_a_cluster_each_worker_task_runs_its_tower_and_task_0_holds_the_variables():
    import tensorflow as tf
    module = load_train_module(EXAMPLE)
    ports = free_ports(2)
    cluster = {"worker": ["localhost:%d" % p for p in ports]}
    args = module.parse_flags(["--hidden", "8"], module.example_flags)
    servers = [tf.compat.v1.train.Server(cluster, job_name="worker", task_index=i,
                                         config=module.task_config(args)) for i in range(2)]
    graph, towers, init, args, devices = towers_graph(
        module, cluster, "--worker_hosts", ",".join(cluster["worker"]))
    assert devices == ["/job:worker/task:0/device:CPU:0", "/job:worker/task:1/device:CPU:0"]
    with tf.compat.v1.Session(servers[0].target, graph=graph) as session:
        session.run(init)
        trace = traced_devices(session, towers.step)
    assert ran_on(trace, "task:0/device:CPU:0", "tower0")
    assert ran_on(trace, "task:1/device:CPU:0", "tower1")
    assert not ran_on(trace, "task:0/device:CPU:0", "tower1")
    assert {v.device for v in towers.params.values()} == {"/job:worker/task:0/device:CPU:0"}


# --- Whole runs ----------------------------------------------------------------------------------
def losses_of(output):
    return [float(line.split("loss=")[1].split()[0]) for line in output.splitlines()
            if " loss=" in line]


def test_the_tower_count_follows_devices_and_three_towers_train_as_one_does(tmp_path):
    """One tower and three, with the same seed and mini-batches: the same losses along the way
    and the same test accuracy at the end (the towers only split the work)."""
    runs = {}
    for devices in (1, 3):
        code, out, err = run_train(EXAMPLE, [
            "--devices", str(devices), "--batch_size", "48", "--steps", "300",
            "--log_dir", str(tmp_path / str(devices))], timeout=180)
        assert code == 0, err[-2000:]
        assert summary_of(out)["towers"] == str(devices)
        assert "[local] the model on %d device(s)" % devices in out
        runs[devices] = out
    assert len(losses_of(runs[3])) == 3
    np.testing.assert_allclose(losses_of(runs[3]), losses_of(runs[1]), atol=2e-3)
    accuracies = [float(summary_of(out)["test_accuracy"]) for out in runs.values()]
    assert abs(accuracies[0] - accuracies[1]) <= 0.01, accuracies


def test_a_rerun_with_the_same_log_dir_resumes_and_a_finished_run_takes_no_step(tmp_path):
    log_dir = ["--log_dir", str(tmp_path), "--devices", "2"]
    summaries = []
    for steps in (200, 300, 300):  # a run, its resume to 300, and a rerun of the finished run
        code, out, err = run_train(EXAMPLE, ["--steps", str(steps)] + log_dir, timeout=180)
        assert code == 0, err[-2000:]
        summaries.append(summary_of(out))
    assert "[local] training from global step 300: log_dir=%s" % tmp_path in out
    assert [(s["global_step"], s["updates"]) for s in summaries] == [
        ("200", "200"), ("300", "100"), ("300", "0")]
    written = scalars(str(tmp_path))
    assert [step for _, step, _ in written["loss"]] == [100, 200, 300]  # each progress line
    assert [step for _, step, _ in written["test_accuracy"]] == [100, 200, 200, 300, 300, 300]


def test_a_batch_that_does_not_split_over_the_towers_fails_in_one_line(tmp_path):
    code, out, err = run_train(EXAMPLE, ["--devices", "3", "--batch_size", "64",
                                         "--log_dir", str(tmp_path)])
    assert code == 2 and "Traceback" not in err
    assert error_lines(err) == ["error: --batch_size 64 cannot be split over 3 towers: give a "
                                "multiple of 3"]


@pytest.mark.parametrize("argv, message", [
    (["--ps_hosts", "localhost:1", "--worker_hosts", "localhost:2"], "has no parameter server"),
    (["--job_name", "worker"], "give --worker_hosts"),
    (["--worker_hosts", "localhost:2", "--task_index", "1", "--job_name", "ps"], "unknown job"),
])
def test_a_cluster_it_cannot_run_on_fails_in_one_line(argv, message, tmp_path):
    code, out, err = run_train(EXAMPLE, argv + ["--log_dir", str(tmp_path)])
    assert code == 2 and len(error_lines(err)) == 1 and message in error_lines(err)[0], err


@pytest.mark.parametrize("task, role", [({"type": "chief", "index": 0}, "worker0"),
                                        ({"type": "worker", "index": 1}, "worker2")])
def test_under_tf_config_a_chief_is_the_client_and_the_workers_follow_it(task, role, monkeypatch):
    import json
    module = load_train_module(EXAMPLE)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {
        "chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"]}, "task": task}))
    args = module.parse_flags([], module.example_flags)
    assert module.resolve_workers(args) == {"worker": ["c:2222", "w0:2222", "w1:2222"]}
    assert args.role == role and args.connect_timeout == 600  # pods may start minutes apart


def test_across_two_tasks_its_client_drives_both(default_runs):
    # the bar, the test metrics in TensorBoard, every process ending by itself:
    # test_examples_end_to_end.py
    run = default_runs[EXAMPLE]
    summary = run.summary()
    assert summary["towers"] == "2" and summary["workers"] == "2"
    assert summary["global_step"] == "2000" and summary["local_steps"] == "2000"
    assert "[worker1] serving 1 device(s) for the client, worker 0 at localhost:" in run.output
    loss = scalars(run.log_dir)["loss"]  # the training loss at each progress line
    assert [step for _, step, _ in loss] == list(range(100, 2001, 100))


def test_a_port_in_use_fails_in_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("", free_ports(1)[0]))
        address = "localhost:%d" % taken.getsockname()[1]
        code, out, err = run_train(EXAMPLE, ["--worker_hosts", address,
                                             "--log_dir", str(tmp_path)], timeout=120)
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert error_lines(err) == ["error: worker0: port %s is already in use: by an earlier run, "
                                "or another program?" % address]


def test_a_client_without_its_workers_and_a_worker_without_its_client_give_up_in_one_line(
        tmp_path):
    # three workers, the third never started: the client waits --connect_timeout for it, and
    # the second, never set up by a client, as long
    tasks = Tasks(EXAMPLE, tmp_path, 3, "--connect_timeout", "5", "--batch_size", "48", ps=0)
    try:
        client, worker = tasks.start("worker", 0), tasks.start("worker", 1)
        assert client.wait(timeout=120) == 2 and worker.wait(timeout=120) == 2
    finally:
        tasks.stop_all()
    third = tasks.common[tasks.common.index("--worker_hosts") + 1].split(",")[2]
    gave_up = error_lines(tasks.output("worker0"))  # (the second too, if it started late)
    assert len(gave_up) == 1 and gave_up[0].startswith("error: worker0: no worker at ") and \
        gave_up[0].endswith("%s: are they running?" % third), gave_up
    assert error_lines(tasks.output("worker1")) == [
        "error: worker1: no client set this worker up within 5 s"]
    assert_nothing_left(str(tmp_path))


def test_a_restarted_client_finds_its_workers_serving_and_ends_them_at_the_end(tmp_path):
    # the client killed mid-run: the other worker serves on; the client started again (as a
    # restart policy would) sets its flag up anew, trains to the end, and ends it
    tasks = Tasks(EXAMPLE, tmp_path, 2, "--steps", "400", "--log_every", "50", ps=0)
    try:
        worker, client = tasks.start("worker", 1), tasks.start("worker", 0)
        tasks.wait_for_line("worker0", "global_step=50 ", timeout=120)
        client.kill()
        client.wait()
        time.sleep(2)  # the client's outage: the worker does not end with it
        assert worker.poll() is None, tasks.output("worker1")
        client = tasks.start("worker", 0)
        assert client.wait(timeout=120) == 0, tasks.output("worker0")
        assert worker.wait(timeout=30) == 0, tasks.output("worker1")
    finally:
        tasks.stop_all()
    assert tasks.summary()["global_step"] == "400"
    assert tasks.output("worker1").endswith("[worker1] the run is over; shutting down")
    # the flag is no variable of the model's: a checkpoint that held it could not be resumed
    # on another number of workers
    import tensorflow as tf
    saved = tf.train.list_variables(tf.train.latest_checkpoint(str(tmp_path / "logs")))
    assert not [name for name, _ in saved if name.startswith("run_over")], saved
    assert_nothing_left(str(tmp_path))


def test_a_lost_worker_ends_the_client_in_one_line_and_nothing_is_left(tmp_path):
    proc = start_example(EXAMPLE, ["--log_dir", str(tmp_path / "logs"), "--steps", "1000000",
                                   "--log_every", "50", "--step_timeout", "10"])
    seen = read_until(proc, "[worker0] global_step=", timeout=120)
    os.kill(started_pid(seen, "worker1"), signal.SIGKILL)
    killed_at = time.time()
    run = finish(proc, timeout=60)
    assert run.code == 1, run.output[-3000:]
    assert time.time() - killed_at < 40
    errors = [l for _, l in run.lines if "] error: " in l]  # (a step cut short, or timed out)
    assert len(errors) == 1 and errors[0].startswith("[worker0] error: worker0 stopped: ") and \
        errors[0].endswith(": a worker is gone or did not answer within --step_timeout"), errors
    assert "Traceback" not in run.output
    assert "[run.sh] failed: worker1 (exit 137)" in run.output or "worker0 (exit 2)" in run.output
    assert_nothing_left(str(tmp_path))


def test_three_tasks_of_two_devices_carry_six_towers_and_ctrl_c_stops_them_all(tmp_path):
    proc = start_example(EXAMPLE, ["--log_dir", str(tmp_path / "logs"), "--steps", "1000000",
                                   "--devices", "2", "--batch_size", "60"],
                         env={"NUM_WORKERS": "3"})
    seen = read_until(proc, "[worker0] global_step=100 ", timeout=120)
    assert "[worker0] the model on 6 device(s): " + " ".join(
        "/job:worker/task:%d/device:CPU:%d" % (t, d) for t in range(3) for d in range(2)) in seen
    assert "[worker2] serving 2 device(s)" in seen
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends to the foreground group
    run = finish(proc, timeout=30)
    assert run.code == 130, run.output[-2000:]
    assert "interrupted: stopping every process" in run.output
    assert_nothing_left(str(tmp_path))

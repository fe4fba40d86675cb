"""Distributed-Setup, the template every distributed example copies: training end to end through
its run.sh, with one worker, two ps, a rerun that resumes; the life cycle of every process (clean
end, a lost worker, a lost chief, a lost ps, Ctrl-C) and the launcher's own checks. The plumbing
below its banner, which every example carries, is tested in test_plumbing.py."""
import os
import signal
import subprocess
import time

import pytest

from support.examples import ACCURACY_BAR
from support.processes import assert_nothing_left
from support.runs import finish, kill_mid_run, read_until, start_example, started_pid


# --- Training end to end through run.sh -----------------------------------------------------------
def test_distributed_setup_trains_every_step_once_on_one_of_its_two_workers(default_runs):
    # the bar, the metrics file, the checkpoints and every process's end:
    # test_examples_end_to_end.py
    summary = default_runs["Distributed-Setup"].summary()
    local_steps = [int(s) for s in summary["local_steps"].split(",")]
    assert len(local_steps) == 2
    # each worker stops once a step shows it the global step at --steps; the other worker's steps
    # already under way still land
    assert 2000 <= int(summary["global_step"]) == sum(local_steps) <= 2003
    assert float(summary["steps_per_sec"]) > 0


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


def test_non_chief_workers_start_training_within_seconds_of_the_chief(default_runs):
    # the stock MonitoredTrainingSession would keep worker1 waiting about 30 s
    run = default_runs["Distributed-Setup"]
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


def test_a_restarted_chief_resumes_at_the_ps_global_step_where_tensorflow_would_roll_back(
        tmp_path):
    # On a real in-process cluster: the chief's session as its session creator makes it, a
    # checkpoint at global step 100, then the ps moves on to 300 and the chief restarts (a new
    # graph, a new session creator). It goes on at 300, where the ps is; TensorFlow's own
    # prepare_session, given the checkpoint_dir, would restore 100 over the live ps.
    import numpy as np
    from support.examples import load_train_module
    from support.in_process import fixed_batch, flags, in_process_cluster
    from support.in_process import worker_config
    module = load_train_module("Distributed-Setup")
    tf = module.tf
    cluster, (server,) = in_process_cluster()
    args = flags(module, "--log_dir", str(tmp_path))
    test_set = (np.zeros((2, 5), np.float32), np.zeros(2, np.int64))

    on_the_ps = lambda: tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
        cluster=cluster, worker_device="/job:worker/task:0"))

    def chief_session():
        with tf.Graph().as_default():
            with on_the_ps():
                sgd = module.build_sgd(args, *fixed_batch())
            worker = module.Worker(args, cluster, lambda x, y: {}, test_set)
            creator = module.StartOrRejoin(worker, server)
            return sgd, worker, creator, creator.create_session()
    sgd, worker, creator, session = chief_session()
    assert not worker.kept_variables  # a new run: initialised
    with session.graph.as_default():
        sgd.global_step.load(100, session)
        creator.saver.save(session, str(tmp_path / "model.ckpt"), global_step=100)
        sgd.global_step.load(300, session)  # the run goes on, on the ps
    session.close()
    sgd, worker, creator, session = chief_session()  # the chief, restarted
    try:
        assert worker.kept_variables and session.run(sgd.global_step) == 300
    finally:
        session.close()
    with tf.Graph().as_default():  # TensorFlow's default, which the session creator corrects
        with on_the_ps():
            sgd = module.build_sgd(args, *fixed_batch())
        manager = tf.compat.v1.train.SessionManager()
        default = manager.prepare_session(server.target, saver=tf.compat.v1.train.Saver(),
                                          checkpoint_dir=str(tmp_path), config=worker_config(0))
        try:
            assert default.run(sgd.global_step) == 100  # the ps rolled back to the checkpoint
        finally:
            default.close()


def test_the_hooks_get_the_global_step_the_last_update_returned_not_a_read_of_the_ps(tmp_path):
    # TensorFlow's StopAtStepHook and CheckpointSaverHook fetch the global step with every run;
    # Progress feeds them the value the last update returned, so a step's graph on the ps holds
    # no read of it for them, and the run still stops at the last step
    import numpy as np
    from support.examples import load_train_module
    from support.in_process import fixed_batch, flags, in_process_cluster
    module = load_train_module("Distributed-Setup")
    tf = module.tf
    cluster, (server,) = in_process_cluster()
    args = flags(module, "--log_dir", str(tmp_path), "--connect_timeout", "5")
    test_set = (np.zeros((2, 5), np.float32), np.zeros(2, np.int64))
    with tf.Graph().as_default():
        with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
                cluster=cluster, worker_device="/job:worker/task:0")):
            sgd = module.build_sgd(args, *fixed_batch())
        worker = module.Worker(args, cluster, lambda x, y: module.model_metrics(
            sgd.params, x, y), test_set)
        with worker.session(server, sgd.loss, sgd.step, last_step=20) as session:
            metadata = tf.compat.v1.RunMetadata()
            session.run(sgd.step, options=tf.compat.v1.RunOptions(output_partition_graphs=True),
                        run_metadata=metadata)
            ops = {node.name for graph in metadata.partition_graphs for node in graph.node}
            assert "global_step" in ops  # the update's own ops on the ps
            assert not [op for op in ops if op.startswith("global_step_read")], sorted(ops)
            while not session.should_stop():
                session.run(sgd.step)
    assert worker.local_steps == 20


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
    os.kill(started_pid(seen, "ps0"), signal.SIGKILL)
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


def test_run_sh_rejects_a_bad_worker_count(tmp_path):
    run = finish(start_example("Distributed-Setup", ["--log_dir", str(tmp_path)],
                               env={"NUM_WORKERS": "two"}), timeout=30)
    assert run.code == 2 and "NUM_PS and NUM_WORKERS must be positive integers" in run.output

"""Distributed-Setup, the template every distributed example copies: training end to end through
its run.sh, with one worker, two ps, a rerun that resumes; the life cycle of every process (clean
end, a lost worker, a lost chief, a lost ps, Ctrl-C) and the launcher's own checks. The plumbing
below its banner, which every example carries, is tested in test_plumbing.py."""
import os
import signal
import subprocess
import time

import pytest

from support.examples import ACCURACY_BAR, load_train_module
from support.processes import assert_nothing_left
from support.runs import finish, kill_mid_run, read_until, start_example, started_pid


# --- Training end to end through run.sh -----------------------------------------------------------
def test_distributed_setup_trains_every_step_once_on_one_of_its_two_workers(default_runs):
    # the bar, the TensorBoard events, the checkpoints and every process's end:
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


# --- The chief's session on a real in-process cluster: what TensorFlow's defaults get wrong -----
def chief_run(module, cluster, server, *argv, last_step=10 ** 6, hooks=(), extra=lambda sgd: None):
    """Distributed-Setup's chief in a graph of its own (a new process, as after a restart): its
    step on a fixed batch, its Worker and its MonitoredSession, the graph left as the default
    (as in train.py); extra(sgd) adds ops first. Returns (sgd, worker, session, extra's)."""
    from support.in_process import fixed_batch, flags, tiny_records
    tf = module.tf
    args = flags(module, *argv)
    args.job_name, args.task_index, args.connect_timeout = "worker", 0, 10.0
    data = module.read_records(tiny_records(os.path.join(args.log_dir, "records")))
    tf.compat.v1.reset_default_graph()
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
            cluster=cluster, worker_device="/job:worker/task:0")):
        sgd = module.build_sgd(args, *fixed_batch())
    worker = module.Worker(args, cluster, lambda x, y: module.model_metrics(sgd.params, x, y),
                           data)
    added = extra(sgd)
    session = worker.session(server, sgd.loss, sgd.step, last_step=last_step, hooks=hooks)
    return sgd, worker, session, added


@pytest.fixture
def graph_mode():
    """tf.compat.v1 graph mode, as train.py's main() sets it, undone after the test."""
    from support.examples import load_train_module as load
    tf = load("Distributed-Setup").tf
    tf.compat.v1.disable_eager_execution()
    yield
    tf.compat.v1.reset_default_graph()
    tf.compat.v1.enable_eager_execution()


def test_a_restarted_chief_resumes_at_the_ps_global_step_where_tensorflow_would_roll_back(
        tmp_path, graph_mode):
    # A checkpoint at global step 100, then the ps moves on to 300 and the chief restarts (a
    # new graph, a new session). It goes on at 300, where the ps is; TensorFlow's own
    # prepare_session, given the checkpoint_dir, would restore 100 over the live ps.
    from support.in_process import fixed_batch, in_process_cluster, worker_config
    module = load_train_module("Distributed-Setup")
    tf = module.tf
    cluster, (server,) = in_process_cluster()
    sgd, worker, session, _ = chief_run(module, cluster, server, "--log_dir", str(tmp_path))
    assert not worker.kept_variables  # a new run: initialised
    raw = session._tf_sess()
    sgd.global_step.load(100, raw)
    worker.saver.save(raw, str(tmp_path / "at100" / "model.ckpt"), global_step=100)
    sgd.global_step.load(300, raw)  # the run goes on, on the ps
    sgd, worker, session, _ = chief_run(module, cluster, server, "--log_dir", str(tmp_path))
    assert worker.kept_variables and session._tf_sess().run(sgd.global_step) == 300
    with tf.Graph().as_default():  # TensorFlow's default, which the session creator corrects
        with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
                cluster=cluster, worker_device="/job:worker/task:0")):
            sgd = module.build_sgd(chief_args(module, tmp_path), *fixed_batch())
        manager = tf.compat.v1.train.SessionManager()
        default = manager.prepare_session(server.target, saver=tf.compat.v1.train.Saver(),
                                          checkpoint_dir=str(tmp_path / "at100"),
                                          config=worker_config(0))
        try:
            assert default.run(sgd.global_step) == 100  # the ps rolled back to the checkpoint
        finally:
            default.close()


def chief_args(module, tmp_path):
    from support.in_process import flags
    return flags(module, "--log_dir", str(tmp_path))


def test_a_first_session_lost_to_a_restart_still_starts_the_clock_and_ends_the_run(
        tmp_path, capsys, graph_mode):
    # a ps restarting as the chief starts: its first session is lost before its first step
    # (Aborted), and MonitoredSession makes another, the first that takes a step; the run then
    # starts, trains and ends
    from support.in_process import in_process_cluster
    module = load_train_module("Distributed-Setup")
    tf = module.tf
    cluster, (server,) = in_process_cluster()

    class LostAtTheStart(module.Hook):
        def after_create_session(self, session, coord):
            if not self.lost:
                self.lost = True
                raise tf.errors.AbortedError(None, None, "a ps restarted as the chief started")
    sgd, worker, session, _ = chief_run(module, cluster, server, "--log_dir", str(tmp_path),
                                        last_step=20, hooks=[LostAtTheStart(lost=False)])
    with session:
        while not session.should_stop():
            session.run(sgd.step)
    out = capsys.readouterr().out
    assert worker.sessions == 2 and out.count("[worker0] training started") == 1, out
    summary = [l for l in out.splitlines() if "] summary " in l]
    assert len(summary) == 1 and "global_step=20 " in summary[0] and "updates=20 " in summary[0]


def test_an_update_retried_in_a_new_session_that_finds_the_run_over_is_not_run_again(
        tmp_path, graph_mode):
    # the last steps land while this worker's step is lost to a restart: MonitoredSession runs
    # the lost step again in the new session, which must end the run instead (run again, the
    # update would land past the last step, and a synchronous one would wait for a round that
    # nobody joins)
    from support.in_process import in_process_cluster
    module = load_train_module("Distributed-Setup")
    tf = module.tf
    cluster, (server,) = in_process_cluster()
    last_step = 20

    class LostAtStep10(module.Hook):  # the others finish the run as this step is lost
        def after_create_session(self, session, coord):
            self.session = session

        def before_run(self, run_context):
            if self.done or not worker.local_steps == 10:
                return None
            self.done = True
            sgd.global_step.load(last_step, self.session)
            raise tf.errors.AbortedError(None, None, "a ps restarted")
    lost = LostAtStep10(done=False)
    sgd, worker, session, _ = chief_run(module, cluster, server, "--log_dir", str(tmp_path),
                                     last_step=last_step, hooks=[lost])
    with session:
        while not session.should_stop():
            session.run(sgd.step)
    assert lost.done and worker.sessions == 2
    assert tf.train.load_checkpoint(str(tmp_path)).get_tensor("global_step") == last_step


def test_with_two_ps_a_ps_that_lost_its_variables_gets_them_back_and_the_other_keeps_its_own(
        tmp_path, capsys, graph_mode):
    # ps1 loses its variables (as when it restarts) while ps0 keeps the global step and the
    # rest: the chief's new session restores ps1's alone from its checkpoint; with no
    # checkpoint it says so in one line and starts ps1's from their initial values
    import numpy as np
    from support.in_process import in_process_cluster
    module = load_train_module("Distributed-Setup")
    tf = module.tf
    cluster, (server,) = in_process_cluster(num_ps=2)
    on = lambda k: [v for v in tf.compat.v1.global_variables() if v.device.endswith("task:%d" % k)]
    sgd, worker, session, lose_ps1 = chief_run(
        module, cluster, server, "--log_dir", str(tmp_path), extra=lambda sgd: [
            tf.raw_ops.DestroyResourceOp(resource=v.handle) for v in on(1)])
    raw = session._tf_sess()
    assert on(0) and on(1) and sgd.global_step in on(0)
    for _ in range(30):
        session.run(sgd.step)
    worker.saver.save(raw, str(tmp_path / "model.ckpt"), global_step=30)
    checkpointed = raw.run(on(1))
    for _ in range(20):
        session.run(sgd.step)
    kept = raw.run(on(0))
    for no_checkpoint in (False, True):
        if no_checkpoint:
            for name in os.listdir(tmp_path):
                if name.startswith(("model.ckpt", "checkpoint")):
                    os.remove(tmp_path / name)
        raw.run(lose_ps1)
        capsys.readouterr()
        raw = worker.create_session()  # as MonitoredSession does after the lost step
        out = capsys.readouterr().out
        assert raw.run(sgd.global_step) == 50 and not worker.kept_variables
        for a, b in zip(raw.run(on(0)), kept):
            np.testing.assert_array_equal(a, b)  # ps0's as it kept them
        ps1 = raw.run(on(1))
        if no_checkpoint:
            assert ("[worker0] ps1 lost its variables, and %s holds no checkpoint: they start "
                    "again from their initial values" % tmp_path) in out, out
        else:
            assert "[worker0] resuming from the checkpoint at global step 50 on ps1" in out, out
            for a, b in zip(ps1, checkpointed):
                np.testing.assert_array_equal(a, b)


def test_a_worker_killed_mid_run_does_not_hang_the_others(tmp_path):
    run = kill_mid_run("Distributed-Setup", tmp_path, ["--steps", "3000"])  # the chief goes on
    assert run.code == 1
    summary = run.summary()
    assert summary["global_step"] == "3000" and summary["lost_workers"] == "1"
    assert float(summary["test_accuracy"]) >= ACCURACY_BAR
    assert "[worker0] 1 worker(s) failed, were lost or never started" in run.output
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

"""Sync-SGD: lockstep steps, backup workers against stragglers and dead workers, no hang."""
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from support.examples import ACCURACY_BAR, error_lines, example_dir, load_train_module, run_train
from support.in_process import (all_at_once, flags, gradient_reference, in_threads, sync_workers,
                                values, worker_sessions)
from support.processes import assert_nothing_left, free_ports
from support.runs import kill_mid_run

sync_sgd = load_train_module("Sync-SGD")


def local_steps(summary):
    return [int(s) for s in summary["local_steps"].split(",")]


def step_seconds(summary):
    """The mean time of a synchronous step: replicas_to_aggregate mini-batches."""
    return int(summary["replicas_to_aggregate"]) / float(summary["steps_per_sec"])


def dropped_gradients(summary):
    """Gradients the workers pushed that no step aggregated (late ones the accumulators drop)."""
    pushed = sum(s for s in local_steps(summary) if s > 0)  # -1: a lost worker
    return pushed - int(summary["updates"]) * int(summary["replicas_to_aggregate"])


@pytest.mark.rule
def test_a_step_applies_n_times_the_learning_rate_times_the_mean_gradient():
    # two workers, each its own fixed batch, one synchronous step: the linear scaling rule,
    # global_params - (N * learning_rate) * (g_0 + g_1) / N, with N = 2
    ops, sessions = sync_workers(sync_sgd.build_sync_sgd, [
        flags(sync_sgd, "--task_index", str(k), "--learning_rate", "0.1") for k in (0, 1)])
    before = values(sessions[0], ops[0].global_params)
    gradients = [gradient_reference(sync_sgd, before, seed=k) for k in (0, 1)]
    all_at_once(sessions, [o.train_op for o in ops])
    assert sessions[0].run(ops[0].global_step) == 1
    for name, value in values(sessions[0], ops[0].global_params).items():
        mean = (gradients[0][name] + gradients[1][name]) / 2
        assert np.abs(mean).max() > 1e-4, name
        np.testing.assert_allclose(value, before[name] - 2 * 0.1 * mean, rtol=1e-4, atol=1e-6,
                                   err_msg=name)


@pytest.mark.rule
def test_a_restarted_chief_drops_the_round_its_predecessor_left_half_done():
    # what a chief killed inside a round left on the ps in the restart runs: one variable's
    # accumulator taken (its step one ahead), the others holding worker 1's gradient, no update
    # and no token for worker 1, which waits. Setting the accumulators' step back (the hook's
    # set-up) left the run waiting for ever; the restarted chief drops the round instead, hands
    # worker 1 a token of the next step, and the round after it is every worker's again.
    (chief, chief_session, start), (worker, worker_session, worker_start) = worker_sessions(
        sync_sgd, sync_sgd.build_sync_sgd, 2, "--learning_rate", "0.1",
        extra=lambda args, ops: sync_sgd.SyncReplicasStart(ops.optimizer, 2, args.task_index == 0))
    initial = values(chief_session, chief.global_params)
    worker_start(worker_session, kept_variables=False)
    tokens = []
    sent = threading.Thread(target=lambda: tokens.append(worker_session.run(worker.train_op)),
                            daemon=True)
    sent.start()  # worker 1's gradient of step 0; then it waits for a token
    deadline = time.time() + 30
    while chief_session.run(start.counts) != [1, 1, 1, 1] and time.time() < deadline:
        time.sleep(0.1)
    assert chief_session.run(start.counts) == [1, 1, 1, 1], "worker 1's gradient never arrived"
    chief_session.run(start.empty[-1])  # the last accumulator taken, as the killed chief left it
    start(chief_session, kept_variables=True)  # the restarted chief's set-up
    sent.join(timeout=30)
    assert not sent.is_alive(), "worker 1 got no token after the chief's restart"
    assert tokens == [1] and chief_session.run(chief.global_step) == 1
    assert chief_session.run(start.counts) == [0, 0, 0, 0]  # nothing of the dropped round left
    before = values(chief_session, chief.global_params)
    for name in initial:  # the dropped round updated nothing
        np.testing.assert_array_equal(before[name], initial[name], err_msg=name)
    gradients = [gradient_reference(sync_sgd, before, seed=k) for k in (0, 1)]
    all_at_once([chief_session, worker_session], [chief.train_op, worker.train_op])
    assert chief_session.run(chief.global_step) == 2
    for name, value in values(chief_session, chief.global_params).items():
        mean = (gradients[0][name] + gradients[1][name]) / 2  # both workers', nothing stale
        np.testing.assert_allclose(value, before[name] - 2 * 0.1 * mean, rtol=1e-4, atol=1e-6,
                                   err_msg=name)


@pytest.mark.rule
@pytest.mark.parametrize("worker1", ["sends its gradient", "is lost"])
def test_a_worker_that_takes_a_spare_token_of_its_step_waits_for_the_step(worker1, capsys):
    # what a worker killed while it waited for its token leaves on the ps: the token handed
    # out for it, spare in the queue. The chief sends its gradient of step 1 and takes that
    # token, of the step it has just sent to. It must not send again (its two gradients would
    # make the step, and it would train on alone): it waits for step 1, made with worker 1's
    # gradient if worker 1 sends it, and ends the run within --step_timeout if none comes.
    (chief, chief_session, start), (worker, worker_session, worker_start) = worker_sessions(
        sync_sgd, sync_sgd.build_sync_sgd, 2, "--learning_rate", "0.1",
        extra=lambda args, ops: sync_sgd.SyncReplicasStart(ops.optimizer, 2, args.task_index == 0))
    args = [flags(sync_sgd, "--task_index", str(k), "--step_timeout", "3") for k in (0, 1)]
    start(chief_session, kept_variables=False)
    worker_start(worker_session, kept_variables=False)
    sides = [(start, chief_session, chief.train_op),
             (worker_start, worker_session, worker.train_op)]
    tokens = [[], []]

    def run_round(k):  # the train op alone: its value, the token taken
        replicas, session, train_op = sides[k]
        tokens[k].append(replicas.run_round(session, train_op, args[k], "synchronous step"))

    in_threads(run_round, 2)  # step 0, every worker's: a token of step 1 each
    assert tokens == [[1], [1]] and chief_session.run(chief.global_step) == 1
    before = values(chief_session, chief.global_params)
    chief_session.run(start.hand_out)  # the token a lost worker left: one of step 1
    assert chief_session.run(start.tokens_left) == 1
    if worker1 == "is lost":
        began = time.time()
        with pytest.raises(SystemExit):
            run_round(0)
        assert 3 <= time.time() - began < 20
        assert ("error: worker0: no synchronous step completed within 3 s: a worker is missing"
                in capsys.readouterr().err)
        assert chief_session.run(chief.global_step) == 1  # nothing applied: one gradient of 1
        assert chief_session.run(start.counts) == [1, 1, 1, 1]
        return
    chief_round = threading.Thread(target=run_round, args=(0,), daemon=True)
    chief_round.start()
    deadline = time.time() + 30
    while chief_session.run(start.tokens_left) > 0 and time.time() < deadline:
        time.sleep(0.1)  # the chief has sent its gradient of step 1 and taken the spare token
    assert chief_session.run(start.counts) == [1, 1, 1, 1]
    gradients = [gradient_reference(sync_sgd, before, seed=k) for k in (0, 1)]
    run_round(1)  # worker 1's gradient of step 1: the step is made, each gradient once
    chief_round.join(timeout=30)
    assert not chief_round.is_alive(), "the chief still waits though step 1 was made"
    assert tokens == [[1, 1], [1, 2]] and chief_session.run(chief.global_step) == 2
    for name, value in values(chief_session, chief.global_params).items():
        mean = (gradients[0][name] + gradients[1][name]) / 2
        np.testing.assert_allclose(value, before[name] - 2 * 0.1 * mean, rtol=1e-4, atol=1e-6,
                                   err_msg=name)


def test_sync_sgd_has_every_worker_in_every_step_and_exits_promptly(default_runs):
    # the bar, and the chief's evaluation of what it checkpointed: test_examples_end_to_end.py
    run = default_runs["Sync-SGD"]
    summary = run.summary()
    global_step = int(summary["global_step"])
    assert global_step == 1000  # --steps 2000 mini-batches, two per synchronous step
    for steps in local_steps(summary):  # each worker pushed one gradient in every step
        assert abs(steps - global_step) <= 1, summary
    assert dropped_gradients(summary) == 0
    # all processes are gone within seconds of the last step, not after a 2-minute grace
    last_step = max(run.first_time("[worker1] done"), run.first_time("[worker0] summary"))
    assert run.first_time("[run.sh] all processes finished") - last_step < 15


def test_the_chief_does_not_train_alone_while_another_worker_starts(tmp_path):
    ps_port, chief_port, late_port = free_ports(3)
    common = [sys.executable, os.path.join(example_dir("Sync-SGD"), "train.py"),
              "--ps_hosts", "localhost:%d" % ps_port,
              "--worker_hosts", "localhost:%d,localhost:%d" % (chief_port, late_port),
              "--steps", "200", "--log_dir", str(tmp_path / "logs"), "--connect_timeout", "60"]
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    run = lambda *role: subprocess.Popen(common + list(role), env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True)
    ps, chief = run("--job_name", "ps"), run("--job_name", "worker", "--task_index", "0")
    try:
        for line in chief.stdout:  # the chief's session is up before worker1 exists
            if "[worker0] chief: log_dir=" in line:
                break
        late = run("--job_name", "worker", "--task_index", "1")
        chief_out, _ = chief.communicate(timeout=120)
        late_out, _ = late.communicate(timeout=60)
        ps.communicate(timeout=30)
    finally:
        for p in (ps, chief):
            p.kill()
    summary_line = [l for l in chief_out.splitlines() if "] summary " in l][0]
    summary = dict(kv.split("=", 1) for kv in summary_line.split("] summary ")[1].split())
    chief_steps, late_steps = local_steps(summary)
    assert int(summary["global_step"]) == 100
    assert chief_steps <= 101 and late_steps >= 99, summary  # no step made of chief gradients only
    assert_nothing_left(str(tmp_path))


def straggler_run(run_example, backup_workers):
    run = run_example("Sync-SGD", "--steps", "36", "--backup_workers", str(backup_workers),
                      "--straggler_delay", "0.5", "--log_every", "1000",
                      env={"NUM_WORKERS": "3"}, timeout=180)
    assert run.code == 0, run.output[-3000:]
    return run.summary()


def test_with_a_backup_worker_the_step_time_follows_the_fast_workers(run_example):
    waiting = straggler_run(run_example, backup_workers=0)
    with_backup = straggler_run(run_example, backup_workers=1)
    # b = 0: every step waits for the straggler's 0.5 s; b = 1: the two fast workers decide
    # (half a second, not less: on a loaded machine a fast worker's step took 0.23 s)
    assert step_seconds(waiting) >= 0.45, waiting
    assert step_seconds(with_backup) < 0.5 * step_seconds(waiting), with_backup
    assert dropped_gradients(with_backup) > 0  # the straggler's late gradients


def test_with_a_backup_worker_a_killed_worker_does_not_stop_training(tmp_path):
    # 3 workers and --backup_workers 1: SIGKILL worker2; training completes and reaches the
    # bar, the chief reports it lost, run.sh exits 1 naming it
    run = kill_mid_run("Sync-SGD", tmp_path, ["--steps", "2000", "--backup_workers", "1"],
                       victim="worker2", env={"NUM_WORKERS": "3"})
    summary = run.summary()  # training completed and reported its accuracy
    assert summary["global_step"] == "1000" and summary["lost_workers"] == "1"
    assert float(summary["test_accuracy"]) >= ACCURACY_BAR
    assert run.code == 1 and "worker2 (exit 137)" in run.output
    assert_nothing_left(str(tmp_path))


def test_more_backup_workers_than_workers_allow_is_rejected():
    code, _, stderr = run_train("Sync-SGD", [
        "--job_name", "worker", "--backup_workers", "2", "--ps_hosts", "localhost:1",
        "--worker_hosts", "localhost:2,localhost:3"])
    assert code == 2
    assert error_lines(stderr) == ["error: --backup_workers 2 needs at least 3 workers (have 2)"]

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


def sync_replicas_start(args, ops):
    """The extra ops of the rule tests below: a worker's SyncReplicasStart and its graph."""
    import tensorflow as tf
    return (sync_sgd.SyncReplicasStart(ops.optimizer, 2, args.task_index == 0),
            tf.compat.v1.get_default_graph())


def the_rounds_ops(graph, names):
    """A round's own ops in a worker's graph, by variable: the send of this worker's gradient to
    the variable's accumulator, and the variable's update (the take of that accumulator, then
    the step); each runs on its own, as a killed chief can leave them."""
    ops = graph.get_operations()
    sends = [op for op in ops if op.type == "ResourceAccumulatorApplyGradient"]  # in order
    updates = {op.inputs[0].op.name: op for op in ops
               if op.type == "ResourceApplyGradientDescent"}
    return dict(zip(names, sends)), updates


def wait_until(condition, what, seconds=30):
    deadline = time.time() + seconds
    while not condition() and time.time() < deadline:
        time.sleep(0.1)  # the pace of the checks
    assert condition(), what


@pytest.mark.rule
def test_a_dropped_round_keeps_the_update_it_made_to_some_variables_and_not_the_others(capsys):
    # the round's update is one op a variable, each waiting only for its own take; only the
    # global step waits for all. What a chief killed inside its round left on the ps: worker
    # 1's gradient in every accumulator, the chief's in all but b2's (its send cut short), w1
    # and b1 taken and updated by the round, w2 full and not yet taken, global step 0. The
    # restarted chief drops the round and says what stays: w1 and b1 keep round 0's update,
    # w2 and b2 have none (a partial step); the next round is a whole step from there.
    (chief, chief_session, (start, graph)), (worker, worker_session, (worker_start, _)) = (
        worker_sessions(sync_sgd, sync_sgd.build_sync_sgd, 2, "--learning_rate", "0.1",
                        extra=sync_replicas_start))
    names = list(chief.global_params)
    sends, updates = the_rounds_ops(graph, names)
    initial = values(chief_session, chief.global_params)
    gradients = [gradient_reference(sync_sgd, initial, seed=k) for k in (0, 1)]
    worker_start(worker_session, kept_variables=False)
    tokens = []
    sent = threading.Thread(target=lambda: tokens.append(worker_session.run(worker.train_op)),
                            daemon=True)
    sent.start()  # worker 1's gradient of step 0; then it waits for a token
    wait_until(lambda: chief_session.run(start.counts) == [1, 1, 1, 1],
               "worker 1's gradient never arrived")
    chief_session.run([sends[name] for name in ("w1", "b1", "w2")])  # the chief's, cut short
    chief_session.run([updates["w1"], updates["b1"]])  # its round, as far as the kill let it
    assert chief_session.run(start.counts) == [0, 0, 2, 1]
    assert chief_session.run(chief.global_step) == 0
    start(chief_session, kept_variables=True)  # the restarted chief's set-up
    sent.join(timeout=30)
    assert not sent.is_alive(), "worker 1 got no token after the chief's restart"
    assert tokens == [1] and chief_session.run(chief.global_step) == 1
    assert chief_session.run(start.counts) == [0, 0, 0, 0]
    assert ("[worker0] the round at global step 0 is dropped: a restart may have left it half "
            "done, its update made to some variables and not to the others (they stay so); "
            "every worker goes on at step 1") in capsys.readouterr().out
    partial = values(chief_session, chief.global_params)
    for name in names:
        mean = (gradients[0][name] + gradients[1][name]) / 2
        assert np.abs(mean).max() > 1e-4, name
        expected = initial[name] - 2 * 0.1 * mean if name in ("w1", "b1") else initial[name]
        np.testing.assert_allclose(partial[name], expected, rtol=1e-4, atol=1e-6, err_msg=name)
    gradients = [gradient_reference(sync_sgd, partial, seed=k) for k in (0, 1)]
    all_at_once([chief_session, worker_session], [chief.train_op, worker.train_op])
    assert chief_session.run(chief.global_step) == 2
    for name, value in values(chief_session, chief.global_params).items():
        mean = (gradients[0][name] + gradients[1][name]) / 2  # both workers', at the partial step
        np.testing.assert_allclose(value, partial[name] - 2 * 0.1 * mean, rtol=1e-4, atol=1e-6,
                                   err_msg=name)


@pytest.mark.rule
@pytest.mark.parametrize("the_chief", ["sends its gradient", "is lost"])
def test_a_restarted_worker_whose_first_step_takes_a_spare_token_waits_for_the_step(the_chief,
                                                                                     capsys):
    # worker 1, killed while it waited for its token of step 1, left that token spare. Its
    # restart (a new process: a new SyncReplicasStart, its session set up afresh) sends its
    # first gradient to step 1 and takes that token, of the step it has just sent to. It must
    # not send again: it waits for step 1, made with the chief's gradient if the chief sends
    # it, and ends the run within --step_timeout if none comes.
    (chief, chief_session, (start, _)), (worker, worker_session, (worker_start, _)) = (
        worker_sessions(sync_sgd, sync_sgd.build_sync_sgd, 2, "--learning_rate", "0.1",
                        extra=sync_replicas_start))
    args = [flags(sync_sgd, "--task_index", str(k), "--step_timeout", "3") for k in (0, 1)]
    start(chief_session, kept_variables=False)
    worker_start(worker_session, kept_variables=False)
    sides = [(start, chief_session, chief.train_op),
             (worker_start, worker_session, worker.train_op)]
    in_threads(lambda k: sides[k][0].run_round(sides[k][1], sides[k][2], args[k], "step"), 2)
    assert chief_session.run(chief.global_step) == 1  # step 0, every worker's
    before = values(chief_session, chief.global_params)
    chief_session.run(start.hand_out)  # the token the killed worker 1 left: one of step 1
    restarted = sync_sgd.SyncReplicasStart(worker.optimizer, 2, is_chief=False)
    restarted(worker_session, kept_variables=False)
    first_step = lambda: restarted.run_round(worker_session, worker.train_op, args[1],
                                             "synchronous step")
    if the_chief == "is lost":
        began = time.time()
        with pytest.raises(SystemExit):
            first_step()
        assert 3 <= time.time() - began < 20
        assert ("error: worker1: no synchronous step completed within 3 s: a worker is missing"
                in capsys.readouterr().err)
        assert chief_session.run(chief.global_step) == 1  # nothing applied: one gradient of 1
        assert chief_session.run(start.counts) == [1, 1, 1, 1]
        return
    tokens = []
    waiting = threading.Thread(target=lambda: tokens.append(first_step()), daemon=True)
    waiting.start()
    wait_until(lambda: chief_session.run(start.tokens_left) == 0,
               "the restarted worker never took the spare token")
    assert chief_session.run(start.counts) == [1, 1, 1, 1]
    gradients = [gradient_reference(sync_sgd, before, seed=k) for k in (0, 1)]
    tokens.append(start.run_round(chief_session, chief.train_op, args[0], "synchronous step"))
    waiting.join(timeout=30)
    assert not waiting.is_alive(), "the restarted worker still waits though step 1 was made"
    assert sorted(tokens) == [1, 2] and chief_session.run(chief.global_step) == 2
    for name, value in values(chief_session, chief.global_params).items():
        mean = (gradients[0][name] + gradients[1][name]) / 2  # each worker's gradient once
        np.testing.assert_allclose(value, before[name] - 2 * 0.1 * mean, rtol=1e-4, atol=1e-6,
                                   err_msg=name)


@pytest.mark.rule
def test_a_restarted_chief_leaves_the_tokens_it_hands_out_to_the_workers_they_are_for():
    # a chief restarted while worker 1 computes (it is not waiting for a token) drops the round
    # and hands worker 1 a token of step 1. Were the chief's own first step, sent to step 1, to
    # take it, a token of the step it has just sent to, it would wait for step 1, and worker 1,
    # its gradient of step 0 dropped as stale, for a token: neither would move again. The
    # chief's first step waits until worker 1 has taken its token; then both make step 1.
    (chief, chief_session, (start, _)), (worker, worker_session, (worker_start, _)) = (
        worker_sessions(sync_sgd, sync_sgd.build_sync_sgd, 2, "--learning_rate", "0.1",
                        extra=sync_replicas_start))
    args = [flags(sync_sgd, "--task_index", str(k), "--step_timeout", "3") for k in (0, 1)]
    start.tries, start.try_seconds = 3, 1  # the wait for the tokens handed out: 3 s at most
    worker_start(worker_session, kept_variables=False)  # worker 1 at step 0
    before = values(chief_session, chief.global_params)
    gradients = [gradient_reference(sync_sgd, before, seed=k) for k in (0, 1)]
    tokens = []

    def restarted_chief():
        start(chief_session, kept_variables=True)
        tokens.append(start.run_round(chief_session, chief.train_op, args[0], "synchronous step"))
    chief_steps = threading.Thread(target=restarted_chief, daemon=True)
    chief_steps.start()
    wait_until(lambda: chief_session.run(chief.global_step) == 1, "the round was never dropped")
    worker_step = lambda: worker_start.run_round(worker_session, worker.train_op, args[1],
                                                 "synchronous step")
    assert worker_step() == 1  # its gradient of step 0, stale; then the token handed out
    assert worker_step() == 2  # its gradient of step 1, with the chief's
    chief_steps.join(timeout=30)
    assert not chief_steps.is_alive(), "the chief still waits though step 1 was made"
    assert tokens == [2] and chief_session.run(chief.global_step) == 2
    for name, value in values(chief_session, chief.global_params).items():
        mean = (gradients[0][name] + gradients[1][name]) / 2  # each worker's gradient of step 1
        np.testing.assert_allclose(value, before[name] - 2 * 0.1 * mean, rtol=1e-4, atol=1e-6,
                                   err_msg=name)


def the_killed_chiefs_take(args, ops):
    """A take of w1's accumulator that waits for 2 gradients, as the killed chief's round left
    it, behind a mark in a queue that says when it is about to wait (and its SyncReplicasStart)."""
    import tensorflow as tf
    accumulator, device = ops.optimizer._accumulator_list[0]  # w1's
    with tf.compat.v1.device(device):
        mark = tf.compat.v1.FIFOQueue(1, tf.int32)
        with tf.control_dependencies([mark.enqueue(1)]):
            take = accumulator.take_grad(2)
    return sync_replicas_start(args, ops)[0], mark.size(), take


@pytest.mark.rule
@pytest.mark.parametrize("take", ["is cancelled", "stays"])
def test_a_restarted_chief_empties_an_accumulator_after_the_lost_chiefs_take_or_ends_the_run(
        take, capsys):
    # the killed chief's round can leave a take waiting on an accumulator, until the ps cancels
    # its call; the restarted chief's emptying waits behind it. It tries again (3 tries of 1 s
    # here): a take cancelled meanwhile lets it through; one that stays would take the dropped
    # round's gradient together with the next round's, so the run ends in one line.
    import tensorflow as tf
    (chief, chief_session, (start, marked, pending)), (worker, worker_session, worker_extras) = (
        worker_sessions(sync_sgd, sync_sgd.build_sync_sgd, 2, extra=the_killed_chiefs_take))
    worker_start = worker_extras[0]
    start.tries, start.try_seconds = 3, 1
    worker_start(worker_session, kept_variables=False)
    tokens = []
    sent = threading.Thread(target=lambda: tokens.append(worker_session.run(worker.train_op)),
                            daemon=True)
    sent.start()  # worker 1's gradient of step 0; then it waits for a token
    wait_until(lambda: chief_session.run(start.counts) == [1, 1, 1, 1],
               "worker 1's gradient never arrived")
    cancelled_after = 1.5 if take == "is cancelled" else 5  # by its deadline, as by the ps

    def the_killed_chiefs_run():
        with pytest.raises(tf.errors.DeadlineExceededError):
            chief_session.run(pending, options=tf.compat.v1.RunOptions(
                timeout_in_ms=int(cancelled_after * 1000)))
    killed = threading.Thread(target=the_killed_chiefs_run, daemon=True)
    killed.start()
    wait_until(lambda: chief_session.run(marked) == 1, "the killed chief's take never started")
    try:
        if take == "stays":
            began = time.time()
            with pytest.raises(SystemExit):
                start(chief_session, kept_variables=True)
            assert 3 <= time.time() - began < cancelled_after
            assert error_lines(capsys.readouterr().err) == [
                "error: worker0: the round at global step 0 cannot be dropped: an accumulator "
                "on the ps stays blocked by a take of the lost chief's, which would carry its "
                "gradients into the next round; restart the ps (it resumes from the last "
                "checkpoint)"]
            assert chief_session.run(chief.global_step) == 0
            return
        start(chief_session, kept_variables=True)
        sent.join(timeout=30)
        assert tokens == [1] and chief_session.run(chief.global_step) == 1
        assert chief_session.run(start.counts) == [0, 0, 0, 0]  # nothing of the dropped round
    finally:
        killed.join(timeout=30)
        if sent.is_alive():
            chief_session.run(start.hand_out)  # worker 1's wait ends
            sent.join(timeout=30)
        assert not killed.is_alive() and not sent.is_alive()


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

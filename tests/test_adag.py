"""ADAG (AGN): the ps adds the accumulated parameter change divided by the window."""

from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from support.examples import load_train_module
from support.in_process import (assert_ticks_are_one_each, fixed_batch, flags, in_process_cluster,
                                in_threads, one_worker_session, values, worker_sessions)

adag = load_train_module("ADAG")


# --- The algorithm, op by op ----------------------------------------------------------------------
@pytest.mark.rule
def test_adag_places_the_parameters_on_the_ps_and_the_local_copies_on_the_worker():
    cluster, _ = in_process_cluster()
    with tf.Graph().as_default():
        adag.build_adag(flags(adag), cluster, *fixed_batch())
        for v in tf.compat.v1.global_variables():
            assert v.device.startswith("/job:ps/task:0"), (v.name, v.device)
        for v in tf.compat.v1.local_variables():
            assert v.device.startswith("/job:worker/task:0"), (v.name, v.device)


@pytest.mark.rule
def test_adag_moves_the_ps_by_the_local_change_divided_by_the_window():
    cluster, (worker,) = in_process_cluster()
    args = flags(adag, "--window", "4", "--learning_rate", "0.1")
    ops, s = one_worker_session(adag.build_adag, args, cluster, worker)
    for push in (1, 2):  # the second window starts from the pulled parameters
        before = values(s, ops.global_params)
        for _ in range(args.window):
            s.run(ops.local_step)
        local = values(s, ops.local_params)
        assert s.run(ops.push) == push
        after = values(s, ops.global_params)
        for name in before:
            change = local[name] - before[name]
            assert np.abs(change).max() > 1e-4, "the local steps should have moved %s" % name
            np.testing.assert_allclose(after[name] - before[name], change / args.window,
                                       rtol=1e-4, atol=1e-7, err_msg=name)
        s.run(ops.pull)
        for name, theta in values(s, ops.local_params).items():
            np.testing.assert_array_equal(theta, after[name])


@pytest.mark.rule
def test_adag_with_a_window_of_one_equals_a_downpour_style_push():
    # A window of 1 divides by 1: the push is the whole local change, as DOWNPOUR pushes it.
    # Compare with the DOWNPOUR example itself, its ps doing plain SGD at the same learning
    # rate, so that its push of the summed gradient is the same local change.
    downpour = load_train_module("DOWNPOUR")
    cluster, (worker,) = in_process_cluster()
    args = flags(adag, "--window", "1", "--learning_rate", "0.1")
    ops, s = one_worker_session(adag.build_adag, args, cluster, worker)
    start = values(s, ops.global_params)
    s.run(ops.local_step)
    local = values(s, ops.local_params)
    s.run(ops.push_and_pull)
    by_adag = values(s, ops.global_params)

    cluster, (worker,) = in_process_cluster()
    args = flags(downpour, "--window", "1", "--learning_rate", "0.1",
                 "--ps_optimizer", "sgd", "--ps_learning_rate", "0.1")
    ops, s = one_worker_session(downpour.build_downpour, args, cluster, worker)
    np.testing.assert_array_equal(values(s, ops.global_params)["w1"], start["w1"])
    s.run(ops.local_step)
    s.run(ops.push_and_pull)
    by_downpour = values(s, ops.global_params)
    for name in start:
        np.testing.assert_allclose(by_adag[name], local[name], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(by_adag[name], by_downpour[name], rtol=1e-6, atol=1e-7)


@pytest.mark.rule
def test_concurrent_pushes_each_tick_the_clock_once_and_count_the_pushes_of_others_between():
    # three workers push at once; the staleness meter counts, per push, the pushes of others
    # since the worker's own previous one: each push's tick its own, none counted below zero
    count, pushes = 3, 20
    workers = worker_sessions(adag, adag.build_adag, count, "--window", "1", extra=lambda args, ops:
                              adag.count_staleness(SimpleNamespace(
                                  args=args, global_step=ops.global_step), ops.push_and_pull))
    ticks = {k: [] for k in range(count)}

    def push_as_fast_as_possible(k):
        ops, s, (push_and_pull, _) = workers[k]
        for _ in range(pushes):
            s.run(ops.local_step)
            ticks[k].append(int(s.run(push_and_pull)))
    in_threads(push_as_fast_as_possible, count)
    assert_ticks_are_one_each([t for k in ticks for t in ticks[k]], count * pushes)
    total = sum(t - 1 - previous for k in ticks for previous, t in zip([0] + ticks[k], ticks[k]))
    ops, s, (_, mean) = workers[0]
    assert s.run(mean) == pytest.approx(total / (count * pushes))
    assert all(a < b for k in ticks for a, b in zip(ticks[k], ticks[k][1:]))


# --- End to end through run.sh --------------------------------------------------------------------
def test_adag_counts_the_pushes_of_others_between_a_pull_and_a_push(default_runs):
    summary = default_runs["ADAG"].summary()
    assert 0 < float(summary["mean_staleness"]) < 2, summary

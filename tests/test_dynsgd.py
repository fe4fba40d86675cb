"""DynSGD: the ps divides each push by its staleness + 1, counted per worker on the ps."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import (assert_a_killed_worker_does_not_hang_the_others, assert_one_push_per_window,
                      assert_trained_to_the_bar, fixed_batch, flags, in_process_cluster,
                      load_train_module, one_worker_session, run_with_defaults, values,
                      worker_config)

dynsgd = load_train_module("DynSGD")


def window(s, ops, steps=3):
    """Train a window; return the change the worker is about to push."""
    for _ in range(steps):
        s.run(ops.local_step)
    local, pulled = values(s, ops.local_params), values(s, ops.pulled_params)
    return {name: local[name] - pulled[name] for name in local}


# --- The algorithm, op by op ----------------------------------------------------------------------
def test_with_one_worker_a_push_is_never_stale_and_lands_whole():
    cluster, (worker,) = in_process_cluster()
    ops, s = one_worker_session(dynsgd.build_dynsgd, flags(dynsgd), cluster, worker)
    s.run(ops.pull)
    for push in (1, 2):
        before, change = values(s, ops.global_params), window(s, ops)
        assert s.run(ops.push_and_pull) == push
        for name, theta in values(s, ops.global_params).items():
            assert np.abs(change[name]).max() > 1e-4
            np.testing.assert_allclose(theta - before[name], change[name], rtol=1e-4, atol=1e-7)
    assert s.run(ops.staleness_sum) == 0 and list(s.run(ops.pulled_at)) == [2]


def test_a_push_that_is_one_push_old_lands_at_half_its_size():
    # worker 0 and worker 1 pull at clock 0; worker 1 pushes (fresh: whole), then worker 0
    # pushes a change computed before that push (staleness 1: halved)
    cluster, workers = in_process_cluster(num_workers=2)
    ops0, s0 = one_worker_session(dynsgd.build_dynsgd, flags(dynsgd), cluster, workers[0])
    args1 = flags(dynsgd, "--task_index", "1")
    with tf.Graph().as_default() as graph:
        ops1 = dynsgd.build_dynsgd(args1, cluster, *fixed_batch(seed=1))
        local_init = tf.compat.v1.local_variables_initializer()
    s1 = tf.compat.v1.Session(workers[1].target, graph=graph, config=worker_config(1))
    s1.run(local_init)
    s0.run(ops0.pull), s1.run(ops1.pull)
    change0, change1 = window(s0, ops0), window(s1, ops1)
    start = values(s0, ops0.global_params)
    assert s1.run(ops1.push) == 1
    assert s0.run(ops0.push) == 2
    for name, theta in values(s0, ops0.global_params).items():
        np.testing.assert_allclose(theta - start[name], change1[name] + change0[name] / 2,
                                   rtol=1e-4, atol=1e-7, err_msg=name)
    assert s0.run(ops0.staleness_sum) == 0 + 1
    # the ps remembers when each worker pulled: a pull records the clock it read
    assert list(s0.run(ops0.pulled_at)) == [0, 0]
    s1.run(ops1.pull)
    assert list(s0.run(ops0.pulled_at)) == [0, 2]


# --- End to end through run.sh --------------------------------------------------------------------
@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """One run with the defaults (1 ps + 2 workers), shared by the tests that read it."""
    return run_with_defaults("DynSGD", tmp_path_factory)


def test_dynsgd_reaches_the_accuracy_bar_with_its_defaults(default_run):
    assert_trained_to_the_bar(default_run, workers=2)


def test_dynsgd_pushes_once_per_window_per_worker(default_run):
    assert_one_push_per_window(default_run, window=5, steps=2000)


def test_dynsgd_with_two_workers_a_push_is_about_one_push_old(default_run):
    # two workers at the same pace: while one trains its window, the other pushes about once
    staleness = float(default_run.summary()["mean_staleness"])
    assert 0.3 < staleness < 2, default_run.summary()


def test_dynsgd_a_worker_killed_mid_run_does_not_hang_the_others(tmp_path):
    assert_a_killed_worker_does_not_hang_the_others("DynSGD", tmp_path, min_global_step=3000 // 5)

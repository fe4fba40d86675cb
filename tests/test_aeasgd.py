"""AEASGD: after every window of local steps, a worker and the centre move towards each other by
alpha times their difference, asynchronously."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import (assert_a_killed_worker_does_not_hang_the_others, assert_one_push_per_window,
                      assert_trained_to_the_bar, fixed_batch, flags, in_process_cluster,
                      load_train_module, one_worker_session, run_with_defaults, values)

aeasgd = load_train_module("AEASGD")


def exchange_once(alpha, window=3):
    """A window of local steps and one exchange on a fixed batch: (local, centre) before, after."""
    cluster, (worker,) = in_process_cluster()
    args = flags(aeasgd, "--window", str(window), "--alpha", str(alpha))
    ops, s = one_worker_session(aeasgd.build_aeasgd, args, cluster, worker)
    for _ in range(window):
        s.run(ops.local_step)
    before = values(s, ops.local_params), values(s, ops.centre)
    assert s.run(ops.exchange) == 1  # the global step counts exchanges
    return before, (values(s, ops.local_params), values(s, ops.centre))


# --- The algorithm, op by op ----------------------------------------------------------------------
def test_aeasgd_keeps_the_centre_on_the_ps_and_the_local_parameters_on_the_worker():
    cluster, _ = in_process_cluster()
    with tf.Graph().as_default():
        aeasgd.build_aeasgd(flags(aeasgd), cluster, *fixed_batch())
        for v in tf.compat.v1.global_variables():
            assert v.device.startswith("/job:ps/task:0"), (v.name, v.device)
        for v in tf.compat.v1.local_variables():
            assert v.device.startswith("/job:worker/task:0"), (v.name, v.device)


def test_an_exchange_moves_worker_and_centre_towards_each_other_by_alpha_times_the_difference():
    (local, centre), (local_after, centre_after) = exchange_once(alpha=0.3)
    for name in local:
        difference = local[name] - centre[name]
        assert np.abs(difference).max() > 1e-4, "the local steps should have moved %s" % name
        np.testing.assert_allclose(local_after[name], local[name] - 0.3 * difference,
                                   rtol=1e-5, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(centre_after[name], centre[name] + 0.3 * difference,
                                   rtol=1e-5, atol=1e-7, err_msg=name)
        # elastic symmetry: the centre gains what the worker gives up, so the sum stays
        np.testing.assert_allclose(local_after[name] + centre_after[name],
                                   local[name] + centre[name], rtol=1e-5, atol=1e-6)
        # and after the exchange the worker is not a copy of the centre (DOWNPOUR's pull is)
        assert not np.allclose(local_after[name], centre_after[name])


def test_with_alpha_one_an_exchange_swaps_worker_and_centre():
    (local, centre), (local_after, centre_after) = exchange_once(alpha=1.0)
    for name in local:
        np.testing.assert_allclose(local_after[name], centre[name], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(centre_after[name], local[name], rtol=1e-5, atol=1e-6)


def test_with_alpha_zero_the_centre_stays_frozen_and_the_worker_trains_alone():
    (local, centre), (local_after, centre_after) = exchange_once(alpha=0.0)
    for name in local:
        np.testing.assert_array_equal(centre_after[name], centre[name])
        np.testing.assert_array_equal(local_after[name], local[name])


# --- End to end through run.sh --------------------------------------------------------------------
@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """One run with the defaults (1 ps + 2 workers), shared by the tests that read it."""
    return run_with_defaults("AEASGD", tmp_path_factory)


def test_aeasgd_reaches_the_accuracy_bar_with_its_defaults(default_run):
    assert_trained_to_the_bar(default_run, workers=2)
    assert float(default_run.summary()["alpha"]) == 0.3


def test_aeasgd_exchanges_once_every_window_of_local_steps_per_worker(default_run):
    assert_one_push_per_window(default_run, window=8, steps=2000)


def test_aeasgd_a_worker_killed_mid_run_does_not_hang_the_others(tmp_path):
    assert_a_killed_worker_does_not_hang_the_others("AEASGD", tmp_path, min_global_step=3000 // 8)

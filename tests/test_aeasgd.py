"""AEASGD: after every window of local steps, a worker and the centre move towards each other by
alpha times their difference, asynchronously."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import (assert_a_killed_worker_does_not_hang_the_others, assert_nothing_left,
                      assert_one_push_per_window, assert_the_chief_evaluated_what_it_checkpointed,
                      assert_trained_to_the_bar, finish, fixed_batch, flags, in_process_cluster,
                      in_threads, load_train_module, one_worker_session, run_with_defaults,
                      sgd_step_reference, start_example, values, worker_sessions)

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


def test_a_local_step_is_sgd_and_after_an_exchange_its_gradient_is_taken_at_the_moved_copy():
    # the one step per window where the example departs from the paper, as its docstring says
    cluster, (worker,) = in_process_cluster()
    args = flags(aeasgd, "--learning_rate", "0.2", "--alpha", "0.3")
    ops, s = one_worker_session(aeasgd.build_aeasgd, args, cluster, worker)
    for _ in range(2):
        before = values(s, ops.local_params)
        s.run(ops.local_step)
        expected = sgd_step_reference(aeasgd, before, 0.2)
        for name, value in values(s, ops.local_params).items():
            assert np.abs(value - before[name]).max() > 1e-4, name
            np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
        s.run(ops.exchange)


def test_two_workers_exchanges_both_land_and_the_second_sees_the_first():
    # worker 1 exchanges, then worker 0: worker 0's exchange reads the centre worker 1 left,
    # and adds to it (an assign of its own result would lose worker 1's)
    workers = worker_sessions(aeasgd, aeasgd.build_aeasgd, 2, "--alpha", "0.3")
    for ops, s, _ in workers:
        for _ in range(3):
            s.run(ops.local_step)
    (ops0, s0, _), (ops1, s1, _) = workers
    centre, x0, x1 = values(s0, ops0.centre), values(s0, ops0.local_params), values(
        s1, ops1.local_params)
    assert s1.run(ops1.exchange) == 1 and s0.run(ops0.exchange) == 2
    centre_after, x0_after = values(s0, ops0.centre), values(s0, ops0.local_params)
    for name in centre:
        centre_1 = centre[name] + 0.3 * (x1[name] - centre[name])
        np.testing.assert_allclose(centre_after[name], centre_1 + 0.3 * (x0[name] - centre_1),
                                   rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(x0_after[name], x0[name] - 0.3 * (x0[name] - centre_1),
                                   rtol=1e-5, atol=1e-6, err_msg=name)


def test_concurrent_exchanges_conserve_the_sum_of_the_centre_and_the_workers():
    # each exchange moves a worker and the centre by equal and opposite amounts: however the
    # exchanges of three workers interleave on the ps, none may be lost
    count = 3
    workers = worker_sessions(aeasgd, aeasgd.build_aeasgd, count, "--alpha", "0.3")
    for ops, s, _ in workers:
        for _ in range(3):
            s.run(ops.local_step)
    chief, chief_session, _ = workers[0]

    def total():  # the centre plus every worker's parameters
        centre = values(chief_session, chief.centre)
        local = [values(s, ops.local_params) for ops, s, _ in workers]
        return {name: centre[name] + sum(x[name] for x in local) for name in centre}
    before = total()
    in_threads(lambda k: [workers[k][1].run(workers[k][0].exchange) for _ in range(40)], count)
    assert chief_session.run(chief.global_step) == count * 40
    for name, value in total().items():
        np.testing.assert_allclose(value, before[name], rtol=1e-4, atol=1e-5, err_msg=name)


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


def test_the_chief_evaluates_the_centre_not_its_own_copy(tmp_path):
    # alpha 0: the centre stays at the initial parameters while the workers train alone, so
    # the centre's accuracy and a worker's are far apart
    run = finish(start_example("AEASGD", ["--log_dir", str(tmp_path / "logs"), "--alpha", "0",
                                       "--steps", "320"]), timeout=180)
    assert run.code == 0, run.output[-3000:]
    assert assert_the_chief_evaluated_what_it_checkpointed(run, "AEASGD") < 0.3, run.summary()
    assert_nothing_left(str(tmp_path))

"""AEASGD: after every window of local steps, a worker and the centre move towards each other by
alpha times their difference, asynchronously."""

import numpy as np
import pytest
import tensorflow as tf

from support.examples import load_train_module
from support.in_process import (fixed_batch, flags, in_process_cluster, in_threads,
                                one_worker_session, sgd_step_reference, values, worker_sessions)

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
@pytest.mark.rule
def test_aeasgd_keeps_the_centre_on_the_ps_and_the_local_parameters_on_the_worker():
    cluster, _ = in_process_cluster()
    with tf.Graph().as_default():
        aeasgd.build_aeasgd(flags(aeasgd), cluster, *fixed_batch())
        for v in tf.compat.v1.global_variables():
            assert v.device.startswith("/job:ps/task:0"), (v.name, v.device)
        for v in tf.compat.v1.local_variables():
            assert v.device.startswith("/job:worker/task:0"), (v.name, v.device)


@pytest.mark.rule
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


@pytest.mark.rule
def test_with_alpha_one_an_exchange_swaps_worker_and_centre():
    (local, centre), (local_after, centre_after) = exchange_once(alpha=1.0)
    for name in local:
        np.testing.assert_allclose(local_after[name], centre[name], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(centre_after[name], local[name], rtol=1e-5, atol=1e-6)


@pytest.mark.rule
def test_with_alpha_zero_the_centre_stays_frozen_and_the_worker_trains_alone():
    (local, centre), (local_after, centre_after) = exchange_once(alpha=0.0)
    for name in local:
        np.testing.assert_array_equal(centre_after[name], centre[name])
        np.testing.assert_array_equal(local_after[name], local[name])


@pytest.mark.rule
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


@pytest.mark.rule
@pytest.mark.parametrize("example", ["AEASGD", "EAMSGD"])  # EAMSGD's exchange is AEASGD's
def test_two_workers_exchanges_both_land_and_the_second_sees_the_first(example):
    # worker 1 exchanges, then worker 0: worker 0's exchange reads the centre worker 1 left,
    # and adds to it (an assign of its own result would lose worker 1's)
    module = load_train_module(example)
    workers = worker_sessions(module, getattr(module, "build_" + example.lower()), 2,
                              "--alpha", "0.3")
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


@pytest.mark.rule
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


# End to end (the default run, an exchange a window, the centre evaluated, a killed worker):
# test_examples_end_to_end.py

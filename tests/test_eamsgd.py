"""EAMSGD: AEASGD's elastic exchange, with Nesterov momentum in each worker's local steps."""

import numpy as np
import pytest
import tensorflow as tf

from support.examples import error_lines, load_train_module, run_train
from support.in_process import (fixed_batch, flags, gradient_reference, in_process_cluster,
                                one_worker_session, values)

eamsgd = load_train_module("EAMSGD")


def started(alpha=0.3, momentum=0.9, learning_rate=0.05):
    cluster, (worker,) = in_process_cluster()
    args = flags(eamsgd, "--window", "4", "--momentum", str(momentum), "--alpha", str(alpha),
                 "--learning_rate", str(learning_rate))
    return eamsgd.build_eamsgd, args, one_worker_session(eamsgd.build_eamsgd, args, cluster,
                                                         worker)


# --- The algorithm, op by op ----------------------------------------------------------------------
@pytest.mark.rule
def test_eamsgd_keeps_the_velocity_on_the_worker():
    cluster, _ = in_process_cluster()
    with tf.Graph().as_default():
        ops = eamsgd.build_eamsgd(flags(eamsgd), cluster, *fixed_batch())
        for v in ops.velocity.values():
            assert v.device.startswith("/job:worker/task:0"), (v.name, v.device)
            assert v not in tf.compat.v1.global_variables()  # not checkpointed, not on the ps
        for v in ops.centre.values():
            assert v.device.startswith("/job:ps/task:0"), (v.name, v.device)


@pytest.mark.rule
def test_with_alpha_zero_a_worker_follows_nesterov_momentum_exactly():
    # TensorFlow's own MomentumOptimizer(use_nesterov=True) keeps its variable at the look-ahead
    # point x + momentum * v, with v = -learning_rate * accumulator: the same trajectory, written
    # another way, so it checks the look-ahead of the example independently.
    _, args, (ops, s) = started(alpha=0.0)
    start = values(s, ops.local_params)
    for _ in range(5):
        s.run(ops.local_step)
    s.run(ops.exchange)
    by_eamsgd = values(s, ops.local_params)
    with tf.Graph().as_default():
        params = {n: tf.compat.v1.Variable(v) for n, v in start.items()}
        loss = eamsgd.model_loss(params, *fixed_batch())
        optimizer = tf.compat.v1.train.MomentumOptimizer(args.learning_rate, args.momentum,
                                                         use_nesterov=True)
        step = optimizer.minimize(loss, var_list=list(params.values()))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for _ in range(5):
                session.run(step)
            for name, p in params.items():
                accumulator = session.run(optimizer.get_slot(p, "momentum"))
                x = session.run(p) + args.momentum * args.learning_rate * accumulator
                assert np.abs(x - start[name]).max() > 1e-4
                np.testing.assert_allclose(by_eamsgd[name], x, rtol=1e-4, atol=1e-6,
                                           err_msg=name)


@pytest.mark.rule
def test_an_exchange_moves_the_parameters_and_leaves_the_velocity():
    _, args, (ops, s) = started(alpha=0.3)
    for _ in range(4):
        s.run(ops.local_step)
    local, centre, velocity = (values(s, ops.local_params), values(s, ops.centre),
                               values(s, ops.velocity))
    assert s.run(ops.exchange) == 1
    local_after, centre_after = values(s, ops.local_params), values(s, ops.centre)
    for name, v in values(s, ops.velocity).items():
        assert np.abs(v).max() > 1e-5, "the local steps should have built up a velocity"
        np.testing.assert_array_equal(v, velocity[name])
        difference = local[name] - centre[name]
        np.testing.assert_allclose(local_after[name], local[name] - 0.3 * difference,
                                   rtol=1e-5, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(centre_after[name], centre[name] + 0.3 * difference,
                                   rtol=1e-5, atol=1e-7, err_msg=name)


# two workers' exchanges, both landing: test_aeasgd.py's test, run on both examples


@pytest.mark.rule
def test_after_an_exchange_the_look_ahead_is_taken_from_the_moved_copy():
    # the one step per window where the example departs from the paper, as its docstring says
    _, args, (ops, s) = started(alpha=0.3)
    for _ in range(4):
        s.run(ops.local_step)
    s.run(ops.exchange)
    moved, velocity = values(s, ops.local_params), values(s, ops.velocity)
    ahead = {name: moved[name] + 0.9 * velocity[name] for name in moved}
    g = gradient_reference(eamsgd, ahead)
    s.run(ops.local_step)
    for name, value in values(s, ops.local_params).items():
        step = 0.9 * velocity[name] - 0.05 * g[name]
        np.testing.assert_allclose(value, moved[name] + step, rtol=1e-5, atol=1e-6, err_msg=name)


# --- Flags ----------------------------------------------------------------------------------------
def test_momentum_and_alpha_may_be_zero_but_the_window_may_not():
    args = flags(eamsgd, "--momentum", "0", "--alpha", "0")  # AEASGD; workers training alone
    assert (args.momentum, args.alpha) == (0, 0)
    code, _, stderr = run_train("EAMSGD", ["--window", "0"])
    assert code == 2 and error_lines(stderr) == ["error: --window must be positive, got 0"]

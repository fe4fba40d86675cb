"""EAMSGD: AEASGD's elastic exchange, with Nesterov momentum in each worker's local steps."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import (assert_a_killed_worker_does_not_hang_the_others, assert_nothing_left,
                      assert_one_push_per_window, assert_the_chief_evaluated_what_it_checkpointed,
                      assert_trained_to_the_bar, error_lines, finish, fixed_batch, flags,
                      gradient_reference, in_process_cluster, load_train_module,
                      one_worker_session, run_train, run_with_defaults, start_example, values,
                      worker_sessions)

eamsgd = load_train_module("EAMSGD")


def started(alpha=0.3, momentum=0.9, learning_rate=0.05):
    cluster, (worker,) = in_process_cluster()
    args = flags(eamsgd, "--window", "4", "--momentum", str(momentum), "--alpha", str(alpha),
                 "--learning_rate", str(learning_rate))
    return eamsgd.build_eamsgd, args, one_worker_session(eamsgd.build_eamsgd, args, cluster,
                                                         worker)


# --- The algorithm, op by op ----------------------------------------------------------------------
def test_eamsgd_keeps_the_velocity_on_the_worker():
    cluster, _ = in_process_cluster()
    with tf.Graph().as_default():
        ops = eamsgd.build_eamsgd(flags(eamsgd), cluster, *fixed_batch())
        for v in ops.velocity.values():
            assert v.device.startswith("/job:worker/task:0"), (v.name, v.device)
            assert v not in tf.compat.v1.global_variables()  # not checkpointed, not on the ps
        for v in ops.centre.values():
            assert v.device.startswith("/job:ps/task:0"), (v.name, v.device)


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


def test_two_workers_exchanges_both_land_and_the_second_sees_the_first():
    # worker 1 exchanges, then worker 0: worker 0's exchange reads the centre worker 1 left,
    # and adds to it (an assign of its own result would lose worker 1's)
    workers = worker_sessions(eamsgd, eamsgd.build_eamsgd, 2, "--alpha", "0.3")
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


# --- End to end through run.sh --------------------------------------------------------------------
@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """One run with the defaults (1 ps + 2 workers), shared by the tests that read it."""
    return run_with_defaults("EAMSGD", tmp_path_factory)


def test_eamsgd_reaches_the_accuracy_bar_with_its_defaults(default_run):
    assert_trained_to_the_bar(default_run, workers=2)
    assert float(default_run.summary()["momentum"]) == 0.9


def test_eamsgd_exchanges_once_every_window_of_local_steps_per_worker(default_run):
    assert_one_push_per_window(default_run, window=8, steps=2000)


def test_eamsgd_a_worker_killed_mid_run_does_not_hang_the_others(tmp_path):
    assert_a_killed_worker_does_not_hang_the_others("EAMSGD", tmp_path, min_global_step=3000 // 8)


def test_momentum_and_alpha_may_be_zero_but_the_window_may_not():
    args = flags(eamsgd, "--momentum", "0", "--alpha", "0")  # AEASGD; workers training alone
    assert (args.momentum, args.alpha) == (0, 0)
    code, _, stderr = run_train("EAMSGD", ["--window", "0"])
    assert code == 2 and error_lines(stderr) == ["error: --window must be positive, got 0"]


def test_the_chief_evaluates_the_centre_not_its_own_copy(tmp_path):
    # alpha 0: the centre stays at the initial parameters while the workers train alone, so
    # the centre's accuracy and a worker's are far apart
    run = finish(start_example("EAMSGD", ["--log_dir", str(tmp_path / "logs"), "--alpha", "0",
                                       "--steps", "320"]), timeout=180)
    assert run.code == 0, run.output[-3000:]
    assert assert_the_chief_evaluated_what_it_checkpointed(run, "EAMSGD") < 0.3, run.summary()
    assert_nothing_left(str(tmp_path))

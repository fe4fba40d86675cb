"""DOWNPOUR: local windows, accumulated gradients pushed to an Adagrad ps, pulls, a real barrier."""
import threading

import numpy as np
import pytest
import tensorflow as tf

from support.examples import load_train_module
from support.in_process import (assert_same, differs, fixed_batch, flags, in_process_cluster,
                                monitored_session_of,
                                one_worker_session, values, worker_config)

downpour = load_train_module("DOWNPOUR")


# --- The algorithm, op by op ----------------------------------------------------------------------
@pytest.mark.rule
def test_downpour_places_the_parameters_on_the_ps_and_the_local_copies_on_the_worker():
    cluster, _ = in_process_cluster()
    with tf.Graph().as_default():
        ops = downpour.build_downpour(flags(downpour, "--local_optimizer", "adagrad"), cluster,
                                      *fixed_batch())
        for v in tf.compat.v1.global_variables():  # parameters, ps Adagrad state, global_step
            assert v.device.startswith("/job:ps/task:0"), (v.name, v.device)
        local = tf.compat.v1.local_variables()
        assert {v.name for v in local} >= {v.name for v in ops.local_params.values()}
        for v in local:  # local copies, accumulators, local Adagrad state
            assert v.device.startswith("/job:worker/task:0"), (v.name, v.device)


@pytest.mark.rule
def test_downpour_local_params_drift_from_the_ps_between_pushes_and_equal_it_after_a_pull():
    cluster, (worker,) = in_process_cluster()
    args = flags(downpour, "--window", "3")
    ops, s = one_worker_session(downpour.build_downpour, args, cluster, worker)
    start = values(s, ops.global_params)
    assert_same(values(s, ops.local_params), start)
    for _ in range(args.window):
        s.run(ops.local_step)
        assert differs(values(s, ops.local_params), start), "the local copy should move"
        assert_same(values(s, ops.global_params), start)  # the ps has not heard of it yet
        assert s.run(ops.global_step) == 0
    assert s.run(ops.push) == 1
    after_push = values(s, ops.global_params)
    assert differs(after_push, start), "the push should move the ps"
    assert differs(values(s, ops.local_params), after_push), "no pull yet"
    s.run(ops.pull)
    assert_same(values(s, ops.local_params), after_push)


@pytest.mark.rule
def test_downpour_push_and_pull_leaves_the_local_copy_equal_to_the_ps_and_starts_afresh():
    # the training loop's one call per window: the push lands, then the pull reads what it left
    cluster, (worker,) = in_process_cluster()
    args = flags(downpour, "--window", "3")
    ops, s = one_worker_session(downpour.build_downpour, args, cluster, worker)
    for push in (1, 2, 3):
        start = values(s, ops.global_params)
        for _ in range(args.window):
            s.run(ops.local_step)
        assert s.run(ops.push_and_pull) == push
        after = values(s, ops.global_params)
        assert differs(after, start), "the push should move the ps"
        assert_same(values(s, ops.local_params), after)
        for name, a in values(s, ops.accumulated_gradients).items():
            assert not a.any(), name  # the next window accumulates from zero


@pytest.mark.rule
def test_downpour_pushes_the_accumulated_gradient_through_adagrad_on_the_ps():
    cluster, (worker,) = in_process_cluster()
    args = flags(downpour, "--window", "4", "--learning_rate", "0.05", "--ps_learning_rate", "0.2")
    ops, s = one_worker_session(downpour.build_downpour, args, cluster, worker)
    start = values(s, ops.global_params)
    for _ in range(args.window):
        s.run(ops.local_step)
    accumulated = values(s, ops.accumulated_gradients)
    local = values(s, ops.local_params)
    for name in start:  # with local SGD: the sum of the gradients is the distance walked / lr
        np.testing.assert_allclose(accumulated[name], (start[name] - local[name]) / 0.05,
                                   rtol=1e-3, atol=1e-4, err_msg=name)
    s.run(ops.push_and_pull)
    for name, theta in values(s, ops.global_params).items():
        a = accumulated[name]  # Adagrad, first update: accumulator 0.1 + a^2
        np.testing.assert_allclose(theta, start[name] - 0.2 * a / np.sqrt(0.1 + a * a),
                                   rtol=1e-5, atol=1e-6, err_msg=name)
    for a in values(s, ops.accumulated_gradients).values():
        assert not a.any(), "the accumulator restarts at zero after a push"


@pytest.mark.rule
def test_downpour_local_adagrad_scales_each_step_by_the_squared_gradients_so_far():
    cluster, (worker,) = in_process_cluster()
    args = flags(downpour, "--local_optimizer", "adagrad", "--learning_rate", "0.1")
    ops, s = one_worker_session(downpour.build_downpour, args, cluster, worker)
    start = values(s, ops.local_params)
    s.run(ops.local_step)
    g = values(s, ops.accumulated_gradients)  # one step: the accumulator holds its gradient
    for name, theta in values(s, ops.local_params).items():
        np.testing.assert_allclose(theta, start[name] - 0.1 * g[name] / np.sqrt(0.1 + g[name] ** 2),
                                   rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.rule
def test_downpour_every_local_step_uses_a_new_batch():
    # Example ids as the only feature: the batch a local step trained on is visible in x.
    ids = np.arange(400)
    x = ids.reshape(-1, 1).astype(np.float32)
    data = downpour.Dataset(x, ids % 10, x[:1], ids[:1], num_classes=10)
    cluster, (worker,) = in_process_cluster()
    args = flags(downpour, "--window", "4", "--batch_size", "32")
    with tf.Graph().as_default() as graph:
        x, y = downpour.training_batches(data, args.batch_size, 0, 1, seed=0)
        ops = downpour.build_downpour(args, cluster, x, y)
        init = [tf.compat.v1.global_variables_initializer(),
                tf.compat.v1.local_variables_initializer()]
    seen = []
    with tf.compat.v1.Session(worker.target, graph=graph,
                              config=worker_config(0)) as s:
        s.run(init[0])
        s.run(init[1])
        downpour.start_the_data(s, 0)
        for _ in range(3):  # three windows, each ended by a push and a pull
            for _ in range(args.window):
                seen.append(frozenset(s.run([ops.local_step, x])[1][:, 0].astype(int)))
            s.run(ops.push_and_pull)
    epoch = len(ids) // args.batch_size  # 12 local steps: one epoch
    assert len(seen) == epoch and len(set(seen)) == epoch, "a local step reused a batch"
    assert len(set().union(*seen)) == epoch * args.batch_size, "an example came twice"


def test_downpour_workers_start_from_the_ps_values_through_the_session_barrier(tmp_path):
    # Worker 1 asks for its session before the chief has initialised anything. It must wait
    # (SessionManager.wait_for_session, as its session creator makes it), then take its local
    # copy from the ps: the chief's values (seed 1), not its own (seed 0).
    cluster, workers = in_process_cluster(num_workers=2)

    def session_of(worker, *argv):
        args = flags(downpour, "--task_index", str(worker), "--log_dir", str(tmp_path), *argv)
        with tf.Graph().as_default():
            ops = downpour.build_downpour(args, cluster, *fixed_batch())
            _, session = monitored_session_of(downpour, args, cluster, workers[worker], ops.loss,
                                              ops.push_and_pull)
        return ops, session
    ready, failed = {}, []

    def join():
        try:
            ready.update(zip(("ops", "session"), session_of(1, "--connect_timeout", "30")))
        except BaseException as e:  # noqa: B036 (a fail() is a SystemExit)
            failed.append(e)
    joining = threading.Thread(target=join, daemon=True)
    joining.start()
    joining.join(3)  # a few of its checks, a second apart
    assert not failed and joining.is_alive(), "worker 1 did not wait for the chief"
    assert "session" not in ready, "worker 1 started before the chief initialised the ps"

    chief, chief_session = session_of(0, "--seed", "1")
    on_ps = values(chief_session, chief.global_params)
    joining.join(10)  # it checks every second (WorkerSessionCreator's own: every 30 s)
    assert "session" in ready, "worker 1 did not start within 10 s of the initialisation"
    try:
        assert_same(values(ready["session"], ready["ops"].local_params), on_ps)
    finally:
        ready["session"].close()
        chief_session.close()
    with tf.Graph().as_default():  # what worker 1 would have drawn by itself
        own = downpour.model_params(5, 8, seed=0)
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            assert differs(values(s, own), on_ps)


# --- End to end through run.sh --------------------------------------------------------------------
def test_downpour_counts_the_pushes_of_others_between_a_pull_and_a_push(default_runs):
    # with two workers, the other's pushes land in between; the mean is per push
    summary = default_runs["DOWNPOUR"].summary()
    assert 0 < float(summary["mean_staleness"]) < 2, summary

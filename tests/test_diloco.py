"""DiLoCo: H inner steps per worker, then the ps applies the mean outer gradient with Nesterov
momentum; with plain SGD at rate 1 on the ps it is Local SGD (model averaging)."""
import numpy as np
import pytest

from support.checks import assert_every_worker_in_every_round
from support.examples import error_lines, load_train_module, run_train
from support.in_process import all_at_once, fixed_batch, flags, sync_workers, values

diloco = load_train_module("DiLoCo")


def two_workers(*extra, window=3):
    return sync_workers(diloco.build_diloco, [
        flags(diloco, "--task_index", str(k), "--window", str(window), *extra)
        for k in (0, 1)])


def one_round(ops, sessions, window=3):
    """Each worker's inner steps, then the round. Returns the global parameters before, the
    workers' parameters just before the round, and the global parameters after."""
    for s, o in zip(sessions, ops):
        for _ in range(window):
            s.run(o.inner_step)
    before = values(sessions[0], ops[0].global_params)
    local = [values(s, o.local_params) for s, o in zip(sessions, ops)]
    all_at_once(sessions, [o.outer_step for o in ops])
    return before, local, values(sessions[0], ops[0].global_params)


# --- The algorithm, op by op ----------------------------------------------------------------------
@pytest.mark.rule
def test_two_rounds_apply_the_mean_outer_gradient_with_nesterov_momentum_on_the_ps():
    ops, sessions = two_workers("--outer_learning_rate", "0.7", "--outer_momentum", "0.9")
    momentum = {}  # the ps's momentum buffer, as the rule in the docstring keeps it
    for round_ in (1, 2):
        before, local, after = one_round(ops, sessions)
        assert sessions[0].run(ops[0].global_step) == round_
        for name in before:
            delta = np.mean([before[name] - local[k][name] for k in (0, 1)], axis=0)
            assert np.abs(delta).max() > 1e-4, "the inner steps should have moved %s" % name
            momentum[name] = 0.9 * momentum.get(name, 0) + delta
            np.testing.assert_allclose(after[name],
                                       before[name] - 0.7 * (delta + 0.9 * momentum[name]),
                                       rtol=1e-4, atol=1e-6,
                                       err_msg="round %d, %s" % (round_, name))
        # every worker starts the next round from the same global parameters
        for s, o in zip(sessions, ops):
            for name, value in values(s, o.local_params).items():
                np.testing.assert_array_equal(value, after[name])
                np.testing.assert_array_equal(values(s, o.start)[name], after[name])


@pytest.mark.rule
def test_at_momentum_zero_and_rate_one_on_the_ps_it_is_local_sgd_model_averaging():
    ops, sessions = two_workers("--outer_learning_rate", "1", "--outer_momentum", "0",
                                "--inner_optimizer", "sgd")
    _, local, after = one_round(ops, sessions)
    for name, value in after.items():
        np.testing.assert_allclose(value, (local[0][name] + local[1][name]) / 2,
                                   rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.rule
def test_the_adamw_state_stays_on_the_worker_and_is_kept_from_round_to_round():
    ops, sessions = two_workers()
    state = ops[0].inner_state
    for v in list(state["m"].values()) + list(state["v"].values()) + [state["t"]]:
        assert v.device.endswith("/job:worker/task:0"), (v.name, v.device)
    for s, o in zip(sessions, ops):
        for _ in range(3):
            s.run(o.inner_step)
    moments = values(sessions[0], state["m"]), values(sessions[0], state["v"])
    all_at_once(sessions, [o.outer_step for o in ops])
    # the round moved the parameters, not the optimizer: its moments and step count go on
    for kept, now in zip(moments, (values(sessions[0], state["m"]),
                                   values(sessions[0], state["v"]))):
        for name in kept:
            assert np.abs(kept[name]).max() > 0
            np.testing.assert_array_equal(now[name], kept[name])
    assert sessions[0].run(state["t"]) == 3
    sessions[0].run(ops[0].inner_step)
    assert sessions[0].run(state["t"]) == 4


def inner_steps_alone(steps, *extra):
    """One worker (its own cluster), steps inner steps on its fixed batch: the parameters
    before and after."""
    [ops], [session] = sync_workers(diloco.build_diloco, [flags(diloco, *extra)])
    before = values(session, ops.local_params)
    for _ in range(steps):
        session.run(ops.inner_step)
    return before, values(session, ops.local_params)


def adam_reference(start, steps, learning_rate):
    """TensorFlow's own Adam (no weight decay) from start, on worker 0's fixed batch."""
    import tensorflow as tf
    with tf.Graph().as_default():
        params = {name: tf.compat.v1.Variable(value) for name, value in start.items()}
        loss = diloco.model_loss(params, *fixed_batch(seed=0))
        train = tf.compat.v1.train.AdamOptimizer(learning_rate).minimize(loss)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for _ in range(steps):
                session.run(train)
            return values(session, params)


@pytest.mark.rule
def test_the_inner_adamw_is_adam_with_the_weight_decay_applied_to_the_parameters():
    start, no_decay = inner_steps_alone(5, "--weight_decay", "0")
    for name, value in adam_reference(start, 5, learning_rate=0.01).items():
        np.testing.assert_allclose(no_decay[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    # decoupled: one step with decay is the step without it minus lr * decay * params, however
    # Adam scales the gradient (an L2 term in the loss would be divided by sqrt(v) instead)
    _, one_step = inner_steps_alone(1, "--weight_decay", "0")
    _, decayed = inner_steps_alone(1, "--weight_decay", "0.5")
    assert np.abs(start["w1"]).max() > 0
    for name in start:
        np.testing.assert_allclose(decayed[name], one_step[name] - 0.01 * 0.5 * start[name],
                                   rtol=1e-5, atol=1e-7, err_msg=name)


# --- End to end through run.sh --------------------------------------------------------------------
def test_diloco_trains_in_rounds_of_h_steps_of_every_worker(default_runs):
    # 2000 mini-batches, 2 workers x H = 10 a round (the bar, and the chief's evaluation of the
    # parameters it checkpointed: test_examples_end_to_end.py)
    summary = assert_every_worker_in_every_round(default_runs["DiLoCo"], rounds=100,
                                                 steps_per_round=10)
    assert summary["inner_optimizer"] == "adamw" and summary["outer_momentum"] == "0.9"


def test_backup_workers_are_refused_in_one_line():
    # a round's outer gradients are aggregated per variable: with backups the set of workers
    # averaged could differ from one variable to the next
    code, _, stderr = run_train("DiLoCo", ["--job_name", "worker", "--backup_workers", "1",
                                           "--ps_hosts", "localhost:1", "--worker_hosts",
                                           "localhost:2,localhost:3,localhost:4"])
    assert code == 2 and error_lines(stderr) == ["error: " + diloco.BACKUP_WORKERS_REFUSED]

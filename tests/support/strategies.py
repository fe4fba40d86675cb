"""One update of a TensorFlow 2 strategy example on a tiny known dataset, in processes of its own
(strategy_step.py), and what the update should have been, computed apart from the example."""
import os
import subprocess
import sys
import tempfile

import numpy as np

from support.examples import (ROOT, USERS_ENVIRONMENT, environment_without_tf_config,
                              load_train_module)
from support.processes import assert_nothing_left, free_ports


def one_strategy_step(example, *argv, processes=1, timeout=180, env=None):
    """Run support/strategy_step.py for a TensorFlow 2 example (in processes processes, task k
    getting k as its argument after argv; env: variables to set for them) and return what it
    wrote: the dataset, the parameters before and after one update."""
    out = tempfile.mkdtemp(prefix="strategy_step_")
    # as a module of the support package, from tests/, so that it loads train.py as the tests do
    command = [sys.executable, "-m", "support.strategy_step", example]
    runs = [subprocess.Popen(command + [os.path.join(out, "%d.npz" % k)]
                             + ([str(k)] if processes > 1 else []) + list(argv),
                             cwd=os.path.join(ROOT, "tests"),
                             env=environment_without_tf_config(env),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for k in range(processes)]
    try:
        outputs = [run.communicate(timeout=timeout)[0] for run in runs]
    finally:
        for run in runs:
            run.kill()
    for run, output in zip(runs, outputs):
        assert run.returncode == 0, output[-3000:]
    assert_nothing_left(out)
    return [dict(np.load(os.path.join(out, "%d.npz" % k))) for k in range(processes)]


def assert_one_sgd_step_of(step, example, learning_rate):
    """step (one_strategy_step's result) moved the parameters by -learning_rate times the
    gradient of the mean loss over the whole dataset, computed apart."""
    import tensorflow as tf
    module = load_train_module(example)
    names = [k[len("before_"):] for k in step if k.startswith("before_")]
    with tf.Graph().as_default():
        params = {n: tf.constant(step["before_" + n]) for n in names}
        loss = module.model_loss(params, step["x"], tf.constant(step["y"]))
        with tf.compat.v1.Session() as session:
            gradients = dict(zip(names, session.run(tf.gradients(loss, list(params.values())))))
    for n in names:
        assert np.abs(gradients[n]).max() > 1e-4, n
        np.testing.assert_allclose(step["after_" + n], step["before_" + n]
                                   - learning_rate * gradients[n], rtol=1e-4, atol=1e-6,
                                   err_msg=n)


def assert_a_resumed_run_reads_its_data_in_an_order_of_its_own(example):
    """A run's first mini-batch (on worker 0) is the same when it starts at global step 0 twice,
    and another when it starts at step 300, as a run resumed there does: the order of the data
    mixes in the step it starts from (strategy_step.py's first-batches)."""
    env = USERS_ENVIRONMENT if example == "Keras-Fit" else None  # tf_keras, as users have it
    (read,) = one_strategy_step("first-batches:" + example, ",".join(map(str, free_ports(3))),
                                env=env)
    first, again, resumed = read["batches"]
    np.testing.assert_array_equal(first, again)  # the seed and the step decide the order
    assert not np.array_equal(first, resumed), "a resumed run replays the first run's order"

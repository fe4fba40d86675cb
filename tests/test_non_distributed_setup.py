"""Non-Distributed-Setup, the baseline: one process trains the shared problem to the bar."""

import numpy as np
import pytest

from support.examples import error_lines, run_train


def test_non_distributed_setup_trains_its_2000_steps_by_default(default_runs):
    # the bar, the metrics file and the checkpoints: test_examples_end_to_end.py
    assert default_runs["Non-Distributed-Setup"].summary()["global_step"] == "2000"


def test_a_rerun_with_the_same_log_dir_resumes_from_the_checkpoint(run_example, tmp_path):
    log_dir = str(tmp_path / "resume")
    first = run_example("Non-Distributed-Setup", "--steps", "300", log_dir=log_dir)
    assert first.code == 0 and first.summary()["global_step"] == "300", first.output[-3000:]
    second = run_example("Non-Distributed-Setup", "--steps", "500", log_dir=log_dir)
    assert "resuming from the checkpoint at global step 300" in second.output
    assert second.summary()["global_step"] == "500" and second.summary()["updates"] == "200"


def test_bad_input_gets_one_line_before_tensorflow_loads(tmp_path):
    code, _, stderr = run_train("Non-Distributed-Setup", ["--batch_size", "0"])
    assert code == 2 and error_lines(stderr) == stderr.splitlines() == [
        "error: --batch_size must be positive, got 0"], stderr


@pytest.mark.parametrize("content", [None, {"x_train": [1], "y_train": [1]}])
def test_a_missing_or_incomplete_data_file_is_reported_in_one_line(tmp_path, content):
    path = tmp_path / "mine.npz"
    if content is not None:  # an .npz without the test arrays
        np.savez(path, **content)
    code, _, stderr = run_train("Non-Distributed-Setup", [
        "--data_path", str(path), "--log_dir", str(tmp_path / "logs")])
    assert code == 2 and "Traceback" not in stderr and len(error_lines(stderr)) == 1, stderr
    line = error_lines(stderr)[0]
    assert line.startswith("error: cannot load %s (" % path), line
    assert line.endswith("): give an .npz with x_train, y_train, x_test and y_test"), line


def one_step(*argv):
    """The parameters before and after one step of build_sgd on a fixed batch, in one process."""
    import tensorflow as tf
    from support.examples import load_train_module
    from support.in_process import fixed_batch, flags, values
    module = load_train_module("Non-Distributed-Setup")
    module.tf = tf
    with tf.Graph().as_default():
        sgd = module.build_sgd(flags(module, *argv), *fixed_batch())
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            before = values(session, sgd.params)
            session.run(sgd.step)
            return before, values(session, sgd.params)


@pytest.mark.rule
def test_the_adamw_baseline_takes_adams_step_and_decays_the_parameters_apart_from_the_gradient():
    # Adam's first step moves every parameter that has a gradient by the learning rate, in the
    # gradient's direction (m / sqrt(v) = g / |g|); plain SGD moves it by lr * g
    adamw = ("--optimizer", "adamw", "--learning_rate", "0.01", "--weight_decay")
    before, adam = one_step(*adamw, "0")
    moved = np.abs(adam["w1"] - before["w1"])
    assert np.allclose(moved[moved > 1e-6], 0.01, rtol=1e-3)
    _, sgd = one_step("--learning_rate", "0.01")
    assert not np.allclose(np.abs(sgd["w1"] - before["w1"]), moved)
    # decoupled: the decay shrinks the parameters by lr * decay whatever the gradient (an L2
    # term in the loss would go through Adam's division by sqrt(v) instead)
    _, decayed = one_step(*adamw, "0.5")
    for name in before:
        np.testing.assert_allclose(decayed[name], adam[name] * (1 - 0.01 * 0.5), rtol=1e-5,
                                   atol=1e-7, err_msg=name)

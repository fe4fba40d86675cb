"""What the runs of several examples must show beyond what every example's run shows
(test_examples_end_to_end.py): a push a window, rounds of every worker, the chief's evaluation
of what it saved, and a lost worker handled as the example's kind handles one."""
import time

import pytest

from support.examples import load_train_module
from support.processes import assert_nothing_left
from support.runs import kill_mid_run


def assert_one_push_per_window(run, window, steps):
    """DOWNPOUR, ADAG, DynSGD, AEASGD and EAMSGD (whose push is the elastic exchange): each
    worker pushes once per whole window of local steps."""
    summary = run.summary()
    local_steps = [int(s) for s in summary["local_steps"].split(",")]
    assert int(summary["window"]) == window, summary
    assert all(s > 0 and s % window == 0 for s in local_steps), local_steps
    assert int(summary["global_step"]) == sum(local_steps) // window
    # --steps counts mini-batches of all workers, so steps / window pushes, and a little more:
    # a worker stops at its first push that returns a global step at the end or past it, so
    # each worker makes at most one push from the end on: at most N - 1 beyond the last needed.
    extra = int(summary["workers"]) - 1
    assert steps // window <= int(summary["global_step"]) <= steps // window + extra


def assert_every_worker_in_every_round(run, rounds, steps_per_round):
    """EASGD and DiLoCo with their defaults: rounds of steps_per_round local steps of every
    worker. Returns the chief's summary."""
    summary = run.summary()
    assert int(summary["global_step"]) == rounds
    for steps in summary["local_steps"].split(","):  # every worker was in every round
        assert abs(int(steps) - rounds * steps_per_round) <= steps_per_round, summary
    return summary


def assert_the_chief_evaluated_what_it_checkpointed(run, example):
    """The chief's reported test accuracy is that of the parameters in its last checkpoint: the
    ps's (the global parameters, or the centre variable), not a worker's own copy."""
    import tensorflow as tf
    module = load_train_module(example)
    log_dir = [l for _, l in run.lines if "[worker0] chief: log_dir=" in l][0].split("=", 1)[1]
    reader = tf.train.load_checkpoint(log_dir)
    data = module.load_dataset("")
    with tf.Graph().as_default():
        params = {name: tf.constant(reader.get_tensor(name)) for name in ("w1", "b1", "w2", "b2")}
        accuracy = module.model_metrics(params, data.x_test, data.y_test)["accuracy"]
        with tf.compat.v1.Session() as session:
            checkpointed = float(session.run(accuracy))
    assert float(run.summary()["test_accuracy"]) == pytest.approx(checkpointed, abs=1e-5), (
        "the chief reported an accuracy its checkpointed parameters do not have")
    return checkpointed


def assert_a_killed_worker_does_not_hang_the_others(example, tmp_path, min_global_step):
    """SIGKILL worker1 mid-run: the chief trains on to the end and reports it lost, the
    ps ends by itself, run.sh exits 1 naming it, and nothing is left. Returns the chief's
    summary."""
    run = kill_mid_run(example, tmp_path, ["--steps", "3000"])
    assert run.code == 1, run.output[-3000:]
    summary = run.summary()
    assert summary["lost_workers"] == "1" and int(summary["global_step"]) >= min_global_step
    assert "[worker0] 1 worker(s) failed, were lost or never started" in run.output
    assert "[run.sh] failed: worker1 (exit 137)" in run.output
    assert_nothing_left(str(tmp_path))
    return summary


def assert_a_lost_worker_stops_the_rounds(example, tmp_path, round_name, steps="200000"):
    """Synchronous examples without backup workers: SIGKILL worker1; the chief fails in one
    line once --step_timeout (5 s) passes with no round, and nothing is left."""
    run = kill_mid_run(example, tmp_path, ["--steps", steps, "--step_timeout", "5"], timeout=60)
    assert run.code == 1
    assert "[worker0] error: worker0: no %s completed within 5 s" % round_name in run.output
    assert "Traceback" not in run.output
    assert time.time() - run.killed_at < 40
    assert_nothing_left(str(tmp_path))

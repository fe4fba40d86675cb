"""Hogwild: one copy of the parameters on the ps, updated by every worker step without a lock."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import (ACCURACY_BAR, assert_a_killed_worker_does_not_hang_the_others,
                      assert_nothing_left, assert_trained_to_the_bar, finish, flags,
                      in_process_cluster, load_train_module, run_with_defaults, start_example,
                      worker_config)

hogwild = load_train_module("Hogwild")



def worker_graph(cluster, task_index):
    """Worker task_index's own graph, as its train.py builds it (between-graph replication)."""
    args = flags(hogwild, "--task_index", str(task_index))
    rng = np.random.default_rng(task_index)  # each worker its own mini-batch
    with tf.Graph().as_default() as graph:
        ops = hogwild.build_hogwild(args, cluster, tf.constant(rng.random((16, 5), np.float32)),
                                    tf.constant(rng.integers(0, 10, 16)))
        new_w1 = tf.compat.v1.placeholder(tf.float32, ops.global_params["w1"].shape)
        write_w1 = ops.global_params["w1"].assign(new_w1)
        init = tf.compat.v1.global_variables_initializer()
    return graph, ops, new_w1, write_w1, init


def test_hogwild_parameters_are_shared_on_the_ps_a_write_through_one_worker_is_read_by_another():
    cluster, workers = in_process_cluster(2)
    graph0, ops0, new_w1, write_w1, init = worker_graph(cluster, 0)
    graph1, ops1, _, _, _ = worker_graph(cluster, 1)
    for ops in (ops0, ops1):
        for v in list(ops.global_params.values()) + [ops.global_step]:
            assert v.device.startswith("/job:ps/task:0"), (v.name, v.device)
    s0 = tf.compat.v1.Session(workers[0].target, graph=graph0,
                              config=worker_config(0))
    s1 = tf.compat.v1.Session(workers[1].target, graph=graph1,
                              config=worker_config(1))
    with s0, s1:
        s0.run(init)  # only worker 0 initialises; worker 1 reads the same variables
        written = np.full(ops0.global_params["w1"].shape, 0.25, np.float32)
        s0.run(write_w1, {new_w1: written})
        np.testing.assert_array_equal(s1.run(ops1.global_params["w1"]), written)

        # a step of worker 1 changes the parameters worker 0 reads, and counts in its step
        before = s0.run(ops0.global_params["w2"])
        s1.run(ops1.step)
        assert s0.run(ops0.global_step) == 1
        assert not np.allclose(s0.run(ops0.global_params["w2"]), before)
        s0.run(ops0.step)
        assert s1.run(ops1.global_step) == 2


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """One run with the defaults (1 ps + 2 workers), shared by the tests that read it."""
    return run_with_defaults("Hogwild", tmp_path_factory)


def test_hogwild_reaches_the_accuracy_bar_with_its_defaults(default_run):
    assert_trained_to_the_bar(default_run, workers=2)


def test_hogwild_final_global_step_is_the_sum_of_the_workers_local_steps(default_run):
    summary = default_run.summary()
    local_steps = [int(s) for s in summary["local_steps"].split(",")]
    assert len(local_steps) == 2 and all(s > 0.2 * sum(local_steps) for s in local_steps)
    assert int(summary["global_step"]) == sum(local_steps)
    # each worker stops once a step shows it the global step at --steps; the steps of the other
    # worker that were already under way still land
    assert 2000 <= int(summary["global_step"]) <= 2003


def test_hogwild_a_worker_killed_mid_run_does_not_hang_the_others(tmp_path):
    summary = assert_a_killed_worker_does_not_hang_the_others("Hogwild", tmp_path,
                                                              min_global_step=3000)
    assert float(summary["test_accuracy"]) >= ACCURACY_BAR  # the chief trained on alone


def test_hogwild_staleness_is_zero_with_one_worker_and_positive_with_two(default_run, tmp_path):
    # with two workers, updates of the other land between a step's pull and its push
    assert float(default_run.summary()["mean_staleness"]) > 0.1
    alone = finish(start_example("Hogwild", ["--log_dir", str(tmp_path / "logs"), "--steps",
                                             "300"], env={"NUM_WORKERS": "1"}), timeout=120)
    assert alone.code == 0, alone.output[-3000:]
    assert alone.summary()["mean_staleness"] == "0"
    assert_nothing_left(str(tmp_path))

"""Hogwild: one copy of the parameters on the ps, updated by every worker step with no barrier."""

from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from support.examples import load_train_module
from support.in_process import (assert_ticks_are_one_each, fixed_batch, flags, in_process_cluster,
                                in_threads, one_worker_session, sgd_step_reference, values,
                                worker_config, worker_sessions)
from support.processes import assert_nothing_left
from support.runs import finish, start_example

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


@pytest.mark.rule
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


@pytest.mark.rule
def test_a_step_subtracts_the_learning_rate_times_the_gradient_on_the_ps():
    cluster, (worker,) = in_process_cluster()
    ops, s = one_worker_session(hogwild.build_hogwild, flags(hogwild, "--learning_rate", "0.1"),
                                cluster, worker)
    before = values(s, ops.global_params)
    assert s.run(ops.step) == 1
    expected = sgd_step_reference(hogwild, before, 0.1)
    for name, value in values(s, ops.global_params).items():
        assert np.abs(value - before[name]).max() > 1e-4, name
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.rule
def test_concurrent_steps_each_tick_the_clock_once_and_count_only_what_they_did_not_read():
    # Three workers step at once. Each step's value is its own tick of the clock (1, 2, ... in
    # some order, none read twice), and the clock it pulled at was read after its own previous
    # step had ticked and before this one did: a staleness of 0 or more, never -1.
    count, steps = 3, 30
    workers = worker_sessions(hogwild, hogwild.build_hogwild, count, extra=lambda args, ops:
                              hogwild.count_staleness(SimpleNamespace(
                                  args=args, global_step=ops.global_step), ops.step,
                                  ops.pulled_at))
    records = {k: [] for k in range(count)}

    def step_as_fast_as_possible(k):
        ops, s, (step, _) = workers[k]
        for _ in range(steps):
            records[k].append(tuple(int(v) for v in s.run([step, ops.pulled_at])))
    in_threads(step_as_fast_as_possible, count)

    assert_ticks_are_one_each([t for k in records for t, _ in records[k]], count * steps)
    total = 0
    for k, steps_of_k in records.items():
        previous = 0
        for tick, pulled_at in steps_of_k:
            assert previous <= pulled_at < tick, (k, previous, pulled_at, tick)
            total += tick - 1 - pulled_at
            previous = tick
    chief, chief_session, (_, mean) = workers[0]
    assert chief_session.run(mean) == pytest.approx(total / (count * steps))
    assert total > 0, "the workers never overlapped: nothing stale was checked"


@pytest.mark.rule
def test_the_clock_ticks_once_per_update_under_contention():
    # tick, the shared helper every asynchronous example counts its updates with: four workers
    # tick as fast as they can, nothing else in between; each tick's value is its own
    count, ticks = 4, 50
    cluster, servers = in_process_cluster(num_workers=count)
    sessions = []
    for k in range(count):
        with tf.Graph().as_default() as graph:
            with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(cluster=cluster)):
                global_step = tf.compat.v1.train.get_or_create_global_step()
            tick = hogwild.tick(global_step)
        s = tf.compat.v1.Session(servers[k].target, graph=graph, config=worker_config(k))
        if k == 0:
            s.run(global_step.initializer)
        sessions.append((s, tick))
    seen = []
    in_threads(lambda k: seen.extend(sessions[k][0].run(sessions[k][1]) for _ in range(ticks)),
               count)
    assert_ticks_are_one_each(seen, count * ticks)


@pytest.mark.rule
def test_a_step_reads_the_clock_before_the_parameters():
    # so that every update the clock counted at the pull is in the parameters the step read
    cluster, _ = in_process_cluster()
    with tf.Graph().as_default():
        ops = hogwild.build_hogwild(flags(hogwild), cluster, *fixed_batch())
        handles = {theta.handle.name for theta in ops.global_params.values()}
        reads, frontier, done = [], [ops.loss.op], set()
        while frontier:  # the loss's inputs, back to the reads of the parameters
            op = frontier.pop()
            if op.name in done:
                continue
            done.add(op.name)
            if op.type == "ReadVariableOp" and op.inputs[0].name in handles:
                reads.append(op)
            frontier.extend(t.op for t in op.inputs)
        assert {r.inputs[0].name for r in reads} == handles
        for r in reads:
            assert ops.pulled_at.op in r.control_inputs, r.name


def test_hogwild_final_global_step_is_the_sum_of_the_workers_local_steps(default_runs):
    summary = default_runs["Hogwild"].summary()
    local_steps = [int(s) for s in summary["local_steps"].split(",")]
    assert len(local_steps) == 2 and all(s > 0.2 * sum(local_steps) for s in local_steps)
    assert int(summary["global_step"]) == sum(local_steps)
    # each worker stops once a step shows it the global step at --steps; the steps of the other
    # worker that were already under way still land
    assert 2000 <= int(summary["global_step"]) <= 2003


def test_hogwild_staleness_is_zero_with_one_worker_and_positive_with_two(default_runs, tmp_path):
    # with two workers, updates of the other land between a step's pull and its push
    assert float(default_runs["Hogwild"].summary()["mean_staleness"]) > 0.1
    alone = finish(start_example("Hogwild", ["--log_dir", str(tmp_path / "logs"), "--steps",
                                             "300"], env={"NUM_WORKERS": "1"}), timeout=120)
    assert alone.code == 0, alone.output[-3000:]
    assert alone.summary()["mean_staleness"] == "0"
    assert_nothing_left(str(tmp_path))

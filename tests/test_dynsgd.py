"""DynSGD: the ps divides each push by its staleness + 1, counted per worker on the ps."""

import numpy as np
import pytest
import tensorflow as tf

from support.examples import load_train_module
from support.in_process import (assert_same, assert_ticks_are_one_each, fixed_batch, flags,
                                in_process_cluster, in_threads, one_worker_session, values,
                                worker_config, worker_sessions)

dynsgd = load_train_module("DynSGD")


def window(s, ops, steps=3):
    """Train a window; return the change the worker is about to push."""
    for _ in range(steps):
        s.run(ops.local_step)
    local, pulled = values(s, ops.local_params), values(s, ops.pulled_params)
    return {name: local[name] - pulled[name] for name in local}


# --- The algorithm, op by op ----------------------------------------------------------------------
@pytest.mark.rule
def test_with_one_worker_a_push_is_never_stale_and_lands_whole():
    cluster, (worker,) = in_process_cluster()
    ops, s = one_worker_session(dynsgd.build_dynsgd, flags(dynsgd), cluster, worker)
    s.run(ops.pull)
    for push in (1, 2):
        before = values(s, ops.global_params)
        assert_same(values(s, ops.local_params), before)  # the pull copied the ps to both
        assert_same(values(s, ops.pulled_params), before)
        change = window(s, ops)
        assert s.run(ops.push_and_pull) == push
        for name, theta in values(s, ops.global_params).items():
            assert np.abs(change[name]).max() > 1e-4
            np.testing.assert_allclose(theta - before[name], change[name], rtol=1e-4, atol=1e-7)
    assert s.run(ops.staleness_sum) == 0 and list(s.run(ops.pulled_at)) == [2]


@pytest.mark.rule
def test_a_push_that_is_one_push_old_lands_at_half_its_size():
    # worker 0 and worker 1 pull at clock 0; worker 1 pushes (fresh: whole), then worker 0
    # pushes a change computed before that push (staleness 1: halved)
    cluster, workers = in_process_cluster(num_workers=2)
    ops0, s0 = one_worker_session(dynsgd.build_dynsgd, flags(dynsgd), cluster, workers[0])
    args1 = flags(dynsgd, "--task_index", "1")
    with tf.Graph().as_default() as graph:
        ops1 = dynsgd.build_dynsgd(args1, cluster, *fixed_batch(seed=1))
        local_init = tf.compat.v1.local_variables_initializer()
    s1 = tf.compat.v1.Session(workers[1].target, graph=graph, config=worker_config(1))
    s1.run(local_init)
    s0.run(ops0.pull), s1.run(ops1.pull)
    change0, change1 = window(s0, ops0), window(s1, ops1)
    start = values(s0, ops0.global_params)
    assert s1.run(ops1.push) == 1
    assert s0.run(ops0.push) == 2
    for name, theta in values(s0, ops0.global_params).items():
        np.testing.assert_allclose(theta - start[name], change1[name] + change0[name] / 2,
                                   rtol=1e-4, atol=1e-7, err_msg=name)
    assert s0.run(ops0.staleness_sum) == 0 + 1
    # the ps remembers when each worker pulled: a pull records the clock it read
    assert list(s0.run(ops0.pulled_at)) == [0, 0]
    s1.run(ops1.pull)
    assert list(s0.run(ops0.pulled_at)) == [0, 2]


@pytest.mark.rule
def test_a_push_run_again_after_a_lost_sessions_pull_is_not_counted():
    # Worker 0 loses its session in the middle of a push-and-pull (a task restarted). Its new
    # session starts as Worker.new_session starts one (its own variables initialised, then the
    # pull) and the step runs again: that push carries no change and must not move the clock,
    # or worker 1, which pulled before, would be scaled as one push staler than it is.
    workers = worker_sessions(dynsgd, dynsgd.build_dynsgd, 2,
                              extra=lambda args, ops: tf.compat.v1.local_variables_initializer())
    (ops0, s0, local_init0), (ops1, s1, _) = workers
    s0.run(ops0.pull), s1.run(ops1.pull)
    window(s0, ops0)
    assert s0.run(ops0.push_and_pull) == 1  # the push that landed before the session was lost
    s0.close()
    s0 = tf.compat.v1.Session(s0.sess_str, graph=s0.graph, config=worker_config(0))
    s0.run(local_init0), s0.run(ops0.pull)  # the new session's start-up
    before = values(s0, ops0.global_params)
    assert s0.run(ops0.push_and_pull) == 1, "the push run again moved the clock"
    assert_same(values(s0, ops0.global_params), before)
    assert s0.run(ops0.staleness_sum) == 0
    # worker 1's push is one push old (worker 0's first), so it lands at half its size
    change1 = window(s1, ops1)
    assert s1.run(ops1.push) == 2
    for name, theta in values(s1, ops1.global_params).items():
        np.testing.assert_allclose(theta - before[name], change1[name] / 2, rtol=1e-4, atol=1e-7,
                                   err_msg=name)
    assert s1.run(ops1.staleness_sum) == 1
    # and worker 0's next window, trained after that pull, is a push again
    window(s0, ops0)
    assert s0.run(ops0.push_and_pull) == 3


def mark_one_coordinate_of_w2(args, ops):
    """Ops to make the change a worker pushes one coordinate of w2 by 1 and nothing else, and
    to set the ps's w2 to zero."""
    which = tf.compat.v1.placeholder(tf.int32, [])
    w2 = ops.global_params["w2"]
    one_hot = tf.reshape(tf.one_hot(which, w2.shape.num_elements()), w2.shape)
    set_change = tf.group(*[ops.local_params[n].assign(
        ops.pulled_params[n] + (one_hot if n == "w2" else 0.0)) for n in ops.global_params],
        ops.trained.assign(True))  # as a window's local steps would leave it
    return which, set_change, w2.assign(tf.zeros(w2.shape))


@pytest.mark.rule
def test_concurrent_pushes_are_each_scaled_by_the_staleness_they_really_had():
    # Three workers push at once, as fast as they can. Each push changes its own coordinate of
    # w2 by 1 and nothing else, so the ps's w2 (from zero) records the scale each push landed
    # with, and the w2 a worker pulled shows which pushes it really had. A push is stale by the
    # pushes that landed between its pull and itself: it must be scaled by 1 / (staleness + 1).
    count, pushes = 3, 24
    workers = worker_sessions(dynsgd, dynsgd.build_dynsgd, count,
                              extra=mark_one_coordinate_of_w2)
    chief, chief_session, (_, _, zero_w2) = workers[0]
    assert count * pushes <= chief.global_params["w2"].shape.num_elements()
    chief_session.run(zero_w2)
    records = []  # (mark, clock of the push, marks the worker had pulled, pulled_at)

    def push_as_fast_as_possible(k):
        ops, s, (which, set_change, _) = workers[k]
        s.run(ops.pull)
        for i in range(pushes):
            had = set(np.flatnonzero(s.run(ops.pulled_params["w2"])).tolist())
            pulled_at = s.run(ops.pulled_at)[k]
            s.run(set_change, {which: k * pushes + i})
            records.append((k * pushes + i, int(s.run(ops.push_and_pull)), had, pulled_at))
    in_threads(push_as_fast_as_possible, count)

    assert_ticks_are_one_each([clock for _, clock, _, _ in records], count * pushes)
    landed = chief_session.run(chief.global_params["w2"]).ravel()
    mark_at = {clock: mark for mark, clock, _, _ in records}
    total = 0
    for mark, clock, had, pulled_at in records:
        # the pull saw exactly the pushes its clock counted, no more, no fewer
        assert had == {mark_at[c] for c in range(1, pulled_at + 1)}, (mark, had, pulled_at)
        staleness = clock - 1 - len(had)  # the pushes landed between this pull and this push
        total += staleness
        np.testing.assert_allclose(landed[mark], 1.0 / (staleness + 1), rtol=1e-5,
                                   err_msg="push %d at clock %d had staleness %d"
                                   % (mark, clock, staleness))
    assert chief_session.run(chief.staleness_sum) == total
    assert total > 0, "the workers never overlapped: nothing stale was checked"


def ops_holding_the_lock(graph):
    """The ops that run while a worker holds the lock: those after a MutexLock and before the
    ConsumeMutexLock that releases it (each critical section's execution on its own)."""
    ops = graph.get_operations()
    consumers = {}
    for op in ops:
        for source in [t.op for t in op.inputs] + list(op.control_inputs):
            consumers.setdefault(source.name, []).append(op)

    def reachable(start, step):
        seen, todo = set(), [start]
        while todo:
            for nxt in step(todo.pop()):
                if nxt.name not in seen:
                    seen.add(nxt.name)
                    todo.append(nxt)
        return seen
    held = set()
    for lock in (op for op in ops if op.type == "MutexLock"):
        after = reachable(lock, lambda op: consumers.get(op.name, []))
        release = [graph.get_operation_by_name(n) for n in after
                   if graph.get_operation_by_name(n).type == "ConsumeMutexLock"]
        before = set().union(*(reachable(r, lambda op: [t.op for t in op.inputs]
                                         + list(op.control_inputs)) for r in release))
        held |= after & before
    return held


@pytest.mark.rule
def test_while_a_worker_holds_the_lock_only_the_ps_works():
    # a traced push-and-pull: every op the lock guards ran on the ps, so the lock is never held
    # across a network hop (the change crosses before it is taken, the pulled values after)
    cluster, (worker,) = in_process_cluster()
    ops, s = one_worker_session(dynsgd.build_dynsgd, flags(dynsgd), cluster, worker)
    s.run(ops.pull)
    window(s, ops)
    metadata = tf.compat.v1.RunMetadata()
    s.run(ops.push_and_pull, options=tf.compat.v1.RunOptions(
        trace_level=tf.compat.v1.RunOptions.FULL_TRACE), run_metadata=metadata)
    held = ops_holding_the_lock(s.graph)
    ran = [(d.device, n.node_name) for d in metadata.step_stats.dev_stats for n in d.node_stats
           if n.node_name in held]
    assert any("AssignAdd" in name for _, name in ran), "the traced step ran no push"
    off_the_ps = sorted({name for device, name in ran if "/job:ps/" not in device})
    assert not off_the_ps, "ran under the lock off the ps: %s" % off_the_ps
    # and nothing it reads is still on its way from the worker when the lock is taken
    from_the_worker = sorted({"%s <- %s" % (name, t.op.name) for name in held
                              for t in s.graph.get_operation_by_name(name).inputs
                              if "/job:worker" in t.op.device})
    assert not from_the_worker, "read under the lock from the worker: %s" % from_the_worker


@pytest.mark.rule
def test_a_push_after_a_clock_restored_behind_the_pull_lands_whole_and_never_divides_by_0():
    # a chief restored from an older checkpoint can leave the clock behind the pull a worker
    # noted: staleness clock - pulled_at would be negative, and at -1 the scale 1 / 0
    cluster, (worker,) = in_process_cluster()
    ops, s = one_worker_session(dynsgd.build_dynsgd, flags(dynsgd), cluster, worker)
    s.run(ops.pull)
    for ahead in (1, 3):
        with s.graph.as_default():
            s.run(ops.pulled_at.assign([s.run(ops.global_step) + ahead]))
        before = values(s, ops.global_params)
        change = window(s, ops)
        s.run(ops.push)
        for name, theta in values(s, ops.global_params).items():
            assert np.all(np.isfinite(theta)), name
            np.testing.assert_allclose(theta - before[name], change[name], rtol=1e-4, atol=1e-7)
        s.run(ops.pull)
    assert s.run(ops.staleness_sum) == 0


# --- End to end through run.sh --------------------------------------------------------------------
def test_dynsgd_with_two_workers_a_push_is_about_one_push_old(default_runs):
    # two workers at the same pace: while one trains its window, the other pushes about once
    summary = default_runs["DynSGD"].summary()
    assert 0.3 < float(summary["mean_staleness"]) < 2, summary

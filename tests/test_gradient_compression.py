"""Gradient-Compression: each compressor against its definition, error feedback's bookkeeping,
the step on a real cluster (every copy takes the same step, a resync makes them equal), and the
default run through run.sh."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from support.examples import (ROOT, error_lines, load_train_module, run_train,
                              run_train_noting_tensorflow)
from support.in_process import (flags, gradient_reference, in_process_cluster, in_threads, values,
                                worker_config, worker_sessions)
from support.namespaces import needs_namespaces
from support.processes import assert_nothing_left

gc = load_train_module("Gradient-Compression")
COMPRESSORS = sorted(gc.COMPRESSORS)


# --- Each compressor against its definition (one process, no cluster) ----------------------------
class Codec(object):
    """A compressor's encode and decode of x in a graph of its own, run with any seed."""

    def __init__(self, name, x, *argv):
        import tensorflow as tf
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.compressor = gc.COMPRESSORS[name](flags(gc, *argv))
            self.seed = tf.compat.v1.placeholder(tf.int64, [2])
            x = tf.constant(x, tf.float32)
            self.message = self.compressor.encode(x, self.seed)
            self.decoded = self.compressor.decode(self.message, x.shape, self.seed)
            self.bytes = gc.message_bytes(self.message)
        self.session = tf.compat.v1.Session(graph=self.graph)

    def __call__(self, seed=(0, 0)):
        return self.session.run(self.decoded, {self.seed: seed})

    def mean_over_seeds(self, draws):
        return np.mean([self((7, i)) for i in range(draws)], axis=0)


def some_tensor(shape=(6, 9), seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


@pytest.mark.rule
def test_no_compression_and_fp16_send_the_tensor_in_4_and_2_bytes_an_entry():
    x = some_tensor()
    assert np.array_equal(Codec("none", x)(), x) and Codec("none", x).bytes == 4 * x.size
    half = Codec("fp16", x)
    assert np.array_equal(half(), x.astype(np.float16).astype(np.float32))
    assert half.bytes == 2 * x.size


@pytest.mark.rule
def test_top_k_keeps_exactly_the_k_largest_magnitudes_in_8_bytes_each():
    x = some_tensor()  # 54 entries; ratio 0.1: k = 5
    codec = Codec("topk", x, "--ratio", "0.1")
    decoded = codec()
    largest = np.argsort(-np.abs(x).ravel())[:5]
    expected = np.zeros(x.size, np.float32)
    expected[largest] = x.ravel()[largest]
    assert np.array_equal(decoded.ravel(), expected)
    assert codec.bytes == 8 * 5


def gradient_like(kind, size=300 * 200, seed=0):
    """Tensors a top-k meets: a normal's magnitudes, a heavy tail, and many ties (a rounded
    update, whole blocks of it zero)."""
    rng = np.random.default_rng(seed)
    if kind == "normal":
        return rng.normal(size=size).astype(np.float32)
    if kind == "heavy_tail":
        return rng.standard_cauchy(size=size).astype(np.float32)
    ties = np.round(rng.normal(size=size) * 4) / 4  # a few values, each taken many times
    ties[: size // 2] = 0.0
    return ties.astype(np.float32)


def top_k_reference(x, k):
    """The flat indices of x's k largest magnitudes, larger first and, among equal ones, the
    lower index first (tf.math.top_k's order)."""
    return np.argsort(-np.abs(x).ravel(), kind="stable")[:k]


def uses_a_threshold(codec):
    return any(op.type == "Where" for op in codec.graph.get_operations())


@pytest.mark.rule
@pytest.mark.parametrize("kind", ["normal", "heavy_tail", "ties"])
def test_sampled_top_k_sends_the_message_of_top_k_over_every_entry(kind):
    x = gradient_like(kind).reshape(300, 200)  # d = 60,000 >= TopK.SAMPLED_FROM: k = 600
    sampled = Codec("topk", x, "--topk_method", "sampled")
    exact = Codec("topk", x, "--topk_method", "exact")
    assert uses_a_threshold(sampled) and not uses_a_threshold(exact)
    values, indices = exact.session.run(exact.message, {exact.seed: (0, 0)})
    np.testing.assert_array_equal(indices, top_k_reference(x, 600))  # exact: tf.math.top_k's
    np.testing.assert_array_equal(values, x.ravel()[indices])
    for seed in range(5):  # whatever sample the step's seed draws: the same message
        got = sampled.session.run(sampled.message, {sampled.seed: (3, seed)})
        np.testing.assert_array_equal(got[1], indices, err_msg="seed %d" % seed)
        np.testing.assert_array_equal(got[0], values, err_msg="seed %d" % seed)
    assert sampled.bytes == exact.bytes == 8 * 600


@pytest.mark.rule
@pytest.mark.parametrize("kind", ["normal", "heavy_tail", "ties"])
def test_the_k_largest_above_any_threshold_are_top_ks_whether_k_or_fewer_reach_it(kind):
    # k or more reach it: top_k among those; fewer: top_k over all. Either way top_k's answer.
    import tensorflow as tf
    x = gradient_like(kind, size=5000, seed=1)
    k, magnitudes = 50, np.abs(x)
    kth = np.sort(magnitudes)[::-1][k - 1]
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        threshold = tf.compat.v1.placeholder(tf.float32, [])
        chosen = gc.largest_above(threshold, tf.constant(magnitudes), k)
        for at in (0.0, kth / 2, kth, np.nextafter(kth, np.float32(np.inf)), magnitudes.max(), np.inf):
            np.testing.assert_array_equal(session.run(chosen, {threshold: at}),
                                          top_k_reference(x, k), err_msg="threshold %g" % at)


@pytest.mark.rule
def test_the_sampled_threshold_lets_k_or_more_but_not_many_more_entries_through():
    # about MARGIN * k reach it: rarely fewer than k (top_k then runs over all d, still exact)
    # and never so many that the top_k over them costs what one over all d does
    import tensorflow as tf
    x = gradient_like("normal", size=2 ** 16)
    k = gc.kept(0.01, x.size)
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        seed = tf.compat.v1.placeholder(tf.int64, [2])
        topk = gc.TopK(flags(gc))
        magnitudes = tf.constant(np.abs(x))
        through = tf.reduce_sum(tf.cast(
            magnitudes >= topk.sampled_threshold(magnitudes, k, seed), tf.int32))
        counts = np.array([session.run(through, {seed: (0, i)}) for i in range(200)])
    assert np.mean(counts < k) <= 0.02, np.sort(counts)[:10]
    assert 1.5 * k <= np.median(counts) <= 2.5 * k and counts.max() <= 4 * k, np.median(counts)


@pytest.mark.rule
def test_random_k_sends_k_values_at_coordinates_every_task_draws_alike_times_d_over_k():
    x = some_tensor()
    codec = Codec("randk", x, "--ratio", "0.1")
    decoded = codec((3, 4))
    chosen = np.flatnonzero(decoded)
    assert len(chosen) == 5 and codec.bytes == 4 * 5  # values only
    np.testing.assert_allclose(decoded.ravel()[chosen], x.ravel()[chosen] * 54 / 5, rtol=1e-6)
    assert np.array_equal(Codec("randk", x, "--ratio", "0.1")((3, 4)), decoded)  # same seed
    assert not np.array_equal(codec((3, 5)), decoded)  # the next step draws others


@pytest.mark.rule
def test_random_k_is_unbiased():
    x, draws = some_tensor(), 3000
    mean = Codec("randk", x, "--ratio", "0.2").mean_over_seeds(draws)  # d/k = 54/11
    # each entry is x d/k with probability k/d, else 0: variance x^2 (d/k - 1)
    spread = np.abs(x) * math.sqrt((54 / 11 - 1) / draws)
    assert np.all(np.abs(mean - x) <= 5 * spread + 1e-6), np.max(np.abs(mean - x) / spread)


@pytest.mark.rule
def test_qsgd_sends_int8_levels_of_the_norm_and_rounds_to_a_neighbouring_level():
    x = some_tensor()
    codec = Codec("qsgd", x, "--levels", "4")
    levels, norm = codec.session.run(codec.message, {codec.seed: (0, 0)})
    assert levels.dtype == np.int8 and codec.bytes == x.size + 4
    assert norm == pytest.approx(np.linalg.norm(x), rel=1e-6)
    decoded = codec()
    np.testing.assert_allclose(decoded, np.linalg.norm(x) * levels / 4, rtol=1e-6)
    # every entry lands on one of the two levels around it: at most a level's width away
    assert np.all(np.abs(decoded - x) <= np.linalg.norm(x) / 4 + 1e-5)
    assert np.all(np.sign(decoded) * np.sign(x) >= 0)


@pytest.mark.rule
def test_qsgd_is_unbiased():
    x, draws = some_tensor(), 3000
    mean = Codec("qsgd", x, "--levels", "4").mean_over_seeds(draws)
    # a level's width is norm / s, and a rounding between two levels has variance at most
    # width^2 / 4
    spread = np.linalg.norm(x) / 4 / 2 / math.sqrt(draws)
    assert np.all(np.abs(mean - x) <= 5 * spread), np.max(np.abs(mean - x)) / spread


@pytest.mark.rule
def test_sign_packs_5_signs_a_byte_zero_among_them_and_scales_them_by_the_mean_magnitude():
    x = some_tensor((4, 3))  # 12 entries: the last byte is three fifths padding
    x[0, 0] = x[2, 1] = 0.0  # zero is sent as zero, neither + nor -
    codec = Codec("sign", x)
    packed, scale = codec.session.run(codec.message, {codec.seed: (0, 0)})
    assert packed.dtype == np.uint8 and packed.shape == (3,) and codec.bytes == 3 + 4
    assert scale == pytest.approx(np.abs(x).mean(), rel=1e-6)
    np.testing.assert_allclose(codec(), np.abs(x).mean() * np.sign(x), rtol=1e-6)


@pytest.mark.rule
def test_the_bytes_of_each_compressor_match_its_message():
    # the MLP of these tests: 5 features, --hidden 8, 10 classes; d = 40 + 8 + 80 + 10
    shapes = {"w1": (5, 8), "b1": (8,), "w2": (8, 10), "b2": (10,)}
    size = {n: int(np.prod(s)) for n, s in shapes.items()}
    k = {n: max(1, round(0.1 * d)) for n, d in size.items()}
    expected = {"none": 4 * 138, "fp16": 2 * 138, "topk": 8 * sum(k.values()),
                "randk": 4 * sum(k.values()), "qsgd": 138 + 4 * 4,
                "sign": sum(math.ceil(d / 5) + 4 for d in size.values()),
                # rank 2: P (m x 2) and Q (n x 2) per matrix, the vectors dense
                "powersgd": 4 * (2 * (5 + 8) + 2 * (8 + 10) + 8 + 10)}
    for name in COMPRESSORS:
        [(ops, _, _)] = worker_sessions(gc, build, 1, "--compressor", name, "--ratio", "0.1")
        assert (ops.push_bytes, ops.pull_bytes) == (expected[name], expected[name]), name


def powersgd_steps(p):
    """PowerSGD's round trips for one worker on a real cluster, each step compressing the same
    tensors p (name -> array): returns a function that runs one step and returns (sent, update,
    the ps's parameters after it; they start at 0)."""
    import tensorflow as tf
    cluster, [server] = in_process_cluster(1)
    with tf.Graph().as_default() as graph:
        args = flags(gc, "--compressor", "powersgd", "--rank", "2")
        with tf.compat.v1.device(gc.PS):
            global_params = {n: tf.compat.v1.Variable(tf.zeros(x.shape)) for n, x in p.items()}
            step = tf.compat.v1.train.get_or_create_global_step()
        with tf.compat.v1.device("/job:worker/task:0"):
            constants = {n: tf.constant(x) for n, x in p.items()}
            wire = gc.Wire(0, 1, gc.random_seeds(0, step.read_value() * 2, sorted(p)), False, {},
                           lambda update, reply: gc.apply_on_ps(global_params, step, update, reply))
            sent, update, _, _ = gc.powersgd_round_trips(gc.PowerSGD(args), constants, wire)
        init = [tf.compat.v1.global_variables_initializer(),
                tf.compat.v1.local_variables_initializer()]
    session = tf.compat.v1.Session(server.target, graph=graph, config=worker_config(0))
    session.run(init)

    def one_step():
        step_sent, step_update = session.run([sent, update])
        return step_sent, step_update, values(session, global_params)  # after the step
    return one_step


@pytest.mark.rule
def test_powersgd_is_exact_on_a_matrix_of_rank_r():
    rng = np.random.default_rng(1)
    matrix = (rng.normal(size=(12, 2)) @ rng.normal(size=(2, 9))).astype(np.float32)  # rank 2
    vector = rng.normal(size=5).astype(np.float32)
    sent, update, on_ps = powersgd_steps({"m": matrix, "v": vector})()
    for got in (sent["m"], update["m"], -on_ps["m"]):
        np.testing.assert_allclose(got, matrix, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(update["v"], vector)  # vectors go dense


@pytest.mark.rule
def test_powersgd_warm_starts_each_step_from_the_last_q_a_power_iteration():
    # Vogels et al. 2019, Algorithm 1: each step starts from the Q the last one ended with. On
    # the same matrix step after step that is a power iteration: the rank-2 approximation
    # approaches the best one (the SVD's first two terms), here by about (s3 / s2)^2 = 1/4 a
    # step. From the same random Q every step it would stay as far off as the first step is.
    rng = np.random.default_rng(2)
    u, _ = np.linalg.qr(rng.normal(size=(12, 4)))
    v, _ = np.linalg.qr(rng.normal(size=(9, 4)))
    singular = np.array([8.0, 4.0, 2.0, 1.0])
    matrix = (u * singular @ v.T).astype(np.float32)
    best = (u[:, :2] * singular[:2]) @ v[:, :2].T
    step = powersgd_steps({"m": matrix})
    errors = [np.linalg.norm(step()[0]["m"] - best) for _ in range(20)]
    assert errors[0] > 0.1, "the first step is already the best: nothing left to show"
    assert errors[-1] < 1e-3 * np.linalg.norm(best), errors
    assert all(later < 0.75 * earlier for earlier, later in zip(errors[:8], errors[1:9])), errors


# --- The step on a real cluster, op by op ---------------------------------------------------------
def build(args, cluster, x, y):
    """What train() builds, on a fixed batch."""
    import tensorflow as tf
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
            cluster=cluster, worker_device="/job:worker/task:%d" % args.task_index)):
        params = gc.model_params(x.shape[1:], args.hidden, args.seed)
    return gc.build_gradient_compression(args, args.task_index, len(cluster["worker"]), params,
                                         lambda p: gc.model_loss(p, x, y))


def one_step(workers, fetch):
    """Every worker's step at once; fetch(ops) -> what else each worker reads in its step."""
    results = {}

    def run(k):
        ops, session, _ = workers[k]
        results[k] = session.run([ops.step, fetch(ops)])[1]
    in_threads(run, len(workers), timeout=60)
    return [results[k] for k in range(len(workers))]


@pytest.mark.rule
def test_with_no_compression_a_step_is_sync_sgd_n_times_the_rate_times_the_mean_gradient():
    workers = worker_sessions(gc, build, 2, "--compressor", "none", "--learning_rate", "0.1")
    ops, session, _ = workers[0]
    before = values(session, ops.global_params)
    one_step(workers, lambda ops: ops.loss)
    gradients = [gradient_reference(gc, before, seed=k) for k in (0, 1)]
    for name, value in values(session, ops.global_params).items():
        mean = (gradients[0][name] + gradients[1][name]) / 2
        np.testing.assert_allclose(value, before[name] - 2 * 0.1 * mean, rtol=1e-4, atol=1e-6,
                                   err_msg=name)


def assert_sums_to(parts, whole, err_msg=""):
    """parts add up to whole to float precision (a few units in the last place of whole)."""
    for name in whole:
        total = sum(part[name] for part in parts)
        np.testing.assert_allclose(total, whole[name], rtol=0,
                                   atol=4e-7 * max(np.abs(whole[name]).max(), 1e-30),
                                   err_msg=err_msg + name)


@pytest.mark.rule
@pytest.mark.parametrize("compressor", ["topk", "sign", "powersgd", "fp16"])
def test_error_feedback_keeps_what_each_message_missed_to_float_precision(compressor):
    # p = lr_eff g + e;  C(p) + e_new = p;  on the ps: mean C(p_k) + e_ps = decode(r) + e_ps_new
    workers = worker_sessions(gc, build, 2, "--compressor", compressor, "--ratio", "0.1",
                              "--learning_rate", "0.1")
    assert workers[0][0].error_feedback  # on by default
    for step in (1, 2, 3):
        before = [(values(s, o.local_params), values(s, o.residuals)) for o, s, _ in workers]
        ps_before = values(workers[0][1], workers[0][0].ps_residuals)
        fetched = one_step(workers, lambda o: {"p": o.p, "sent": o.sent, "update": o.update})
        for k, (ops, session, _) in enumerate(workers):
            (params, residual), got = before[k], fetched[k]
            gradient = gradient_reference(gc, params, seed=k)
            expected_p = {n: 2 * 0.1 * gradient[n] + residual[n] for n in params}
            for n in params:
                np.testing.assert_allclose(got["p"][n], expected_p[n], rtol=1e-4, atol=1e-7)
            kept = values(session, ops.residuals)
            assert_sums_to([got["sent"], kept], got["p"], "step %d worker %d " % (step, k))
            assert any(np.abs(e).max() > 0 for e in kept.values()), "no residual kept"
        if compressor != "powersgd":  # its reply is exact: the ps keeps no residual
            mean_sent = {n: (fetched[0]["sent"][n] + fetched[1]["sent"][n]) / 2
                         for n in fetched[0]["sent"]}
            ps_after = values(workers[0][1], workers[0][0].ps_residuals)
            total = {n: mean_sent[n] + ps_before[n] for n in mean_sent}
            assert_sums_to([fetched[0]["update"], ps_after], total, "the ps, step %d " % step)


@pytest.mark.rule
def test_sampled_top_k_takes_exact_top_ks_steps_and_keeps_its_residuals(monkeypatch):
    # the tests' model is small: every tensor takes the sampled way here, the threshold's
    # candidates and all. The two ways send the same messages, so every value matches.
    monkeypatch.setattr(gc.TopK, "SAMPLED_FROM", 1)
    runs = {}
    for method in ("exact", "sampled"):
        workers = worker_sessions(gc, build, 2, "--compressor", "topk", "--ratio", "0.1",
                                  "--learning_rate", "0.1", "--topk_method", method)
        for step in (1, 2, 3):
            fetched = one_step(workers, lambda o: {"p": o.p, "sent": o.sent, "update": o.update})
        ops, session, _ = workers[0]
        runs[method] = (fetched, values(session, ops.global_params),
                        [values(s, o.residuals) for o, s, _ in workers],
                        values(session, ops.ps_residuals))
    for name, exact, sampled in zip(("step 3", "the ps's parameters", "the residuals",
                                     "the ps's residual"), runs["exact"], runs["sampled"]):
        for a, b in zip(leaves(exact), leaves(sampled)):
            np.testing.assert_array_equal(a, b, err_msg=name)
    fetched, _, residuals, _ = runs["sampled"]
    for k in (0, 1):  # what was not sent is kept, to float precision
        assert_sums_to([fetched[k]["sent"], residuals[k]], fetched[k]["p"], "worker %d " % k)


def leaves(structure):
    """A nest of dicts and lists as a flat list of arrays, dicts in the order of their keys."""
    if isinstance(structure, dict):
        return [leaf for key in sorted(structure) for leaf in leaves(structure[key])]
    if isinstance(structure, (list, tuple)):
        return [leaf for item in structure for leaf in leaves(item)]
    return [structure]


@pytest.mark.rule
@pytest.mark.parametrize("argv", [["--compressor", "randk"], ["--compressor", "qsgd"],
                                  ["--compressor", "topk", "--no-error_feedback"]])
def test_unbiased_compressors_and_no_error_feedback_keep_no_residual(argv):
    workers = worker_sessions(gc, build, 2, *argv)
    assert not workers[0][0].error_feedback
    one_step(workers, lambda o: o.loss)
    for ops, session, _ in workers:
        assert all(np.abs(e).max() == 0 for e in values(session, ops.residuals).values())


@pytest.mark.rule
@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_every_copy_takes_the_same_step_and_a_resync_repairs_a_copy_that_drifted(compressor):
    workers = worker_sessions(gc, build, 2, "--compressor", compressor, "--ratio", "0.1",
                              "--levels", "8")
    first = values(workers[0][1], workers[0][0].global_params)
    for step in (1, 2, 3):
        one_step(workers, lambda o: o.loss)
        on_ps = values(workers[0][1], workers[0][0].global_params)
        for ops, session, _ in workers:  # both workers' copies are the ps's, bit for bit
            assert session.run(ops.global_step) == step
            for name, value in values(session, ops.local_params).items():
                np.testing.assert_array_equal(value, on_ps[name], err_msg=name)
    assert any(np.abs(on_ps[n] - first[n]).max() > 0 for n in first), "nothing moved"
    ops, session, _ = workers[1]
    with session.graph.as_default():  # a drift, as a copy on a faulty machine might have
        session.run(ops.local_params["w1"].assign_add(np.ones_like(on_ps["w1"])))
    for ops, session, _ in workers:
        session.run(ops.resync)
        for name, value in values(session, ops.local_params).items():
            np.testing.assert_array_equal(value, on_ps[name], err_msg=name)


def build_with_a_blank_feature(args, cluster, x, y):
    """build, on a batch whose first feature is always 0 (a blank pixel): its row of w1 gets
    a gradient of exactly 0 at every step."""
    return build(args, cluster, x * np.array([0, 1, 1, 1, 1], np.float32), y)


@pytest.mark.rule
def test_sign_without_error_feedback_leaves_a_coordinate_whose_gradient_is_0_where_it_is():
    workers = worker_sessions(gc, build_with_a_blank_feature, 2, "--compressor", "sign",
                              "--no-error_feedback")
    ops, session, _ = workers[0]
    first = values(session, ops.global_params)
    for _ in range(3):
        one_step(workers, lambda o: o.loss)
    after = values(session, ops.global_params)
    np.testing.assert_array_equal(after["w1"][0], first["w1"][0])  # the blank feature's row
    assert np.all(after["w1"][1:] != first["w1"][1:]), "the other rows should all have moved"


# --- End to end through run.sh --------------------------------------------------------------------
def test_the_default_run_pushes_and_pulls_top_k_messages(default_runs):
    # the bar and every process's end: test_examples_end_to_end.py
    summary = default_runs["Gradient-Compression"].summary()
    assert summary["compressor"] == "topk" and summary["error_feedback"] == "True"
    assert int(summary["global_step"]) == 1000 and summary["local_steps"] == "1000,1000"
    # top-k at 1%: 8 bytes for each of 1% of the entries, 50 times less than dense fp32
    assert int(summary["dense_bytes"]) >= 45 * int(summary["push_bytes"])
    assert summary["pull_bytes"] == summary["push_bytes"]


@pytest.mark.parametrize("argv,message", [
    (["--levels", "200"], "--levels 200 does not fit QSGD's int8 levels: at most 127"),
    (["--ratio", "2"], "--ratio 2: the fraction of entries sent is at most 1")])
def test_flags_out_of_range_are_refused_in_one_line(argv, message):
    code, _, stderr = run_train("Gradient-Compression", ["--job_name", "worker", "--ps_hosts",
                                                         "localhost:1", "--worker_hosts",
                                                         "localhost:2"] + argv)
    assert code == 2 and error_lines(stderr) == ["error: " + message]


def test_more_than_one_ps_is_refused_in_one_line_before_tensorflow_loads():
    # the step is applied on ps 0, where the messages meet: a variable on another ps would
    # get that step dense over the network, every step
    code, _, stderr, loaded = run_train_noting_tensorflow("Gradient-Compression", [
        "--job_name", "worker", "--ps_hosts", "localhost:1,localhost:2", "--worker_hosts",
        "localhost:3", "--connect_timeout", "2"])  # were it taken: no ps there, a short wait
    assert code == 2 and not loaded
    assert error_lines(stderr) == ["error: Gradient-Compression runs on one ps, not 2: its "
                                   "messages meet on ps 0, which applies each step to the "
                                   "parameters there (give one ps host; NUM_PS=1 for run.sh)"]


@pytest.mark.benchmark
@pytest.mark.cluster
@pytest.mark.timeout(900)
@needs_namespaces
def test_the_compression_benchmark_measures_bytes_on_the_wire_and_accuracy(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "compression.py"),
                           "--quick", "--bandwidth", "100mbit", "--out", str(out)],
                          capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in (out / "compression.md").read_text().splitlines()
            if line.startswith(("| none |", "| topk |"))}
    assert set(rows) == {"none", "topk"}
    # top-k at 1% pushes 8 bytes for 1% of the entries: many times less on the wire too
    assert float(rows["topk"][5].split("x")[0]) >= 10, rows
    assert_nothing_left(str(tmp_path))

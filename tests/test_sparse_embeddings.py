"""Sparse-Embeddings (and Sparse-Embeddings-TF2): a table sharded over the ps, a slice on each; a
step moves and changes only the rows of its mini-batch; the model ranks clicks well above
chance; checkpoints of the slices resume with the same number of ps and with another; every
process exits by itself."""
import os
import sys

import numpy as np
import pytest

from support.examples import ROOT, error_lines, load_train_module, run_train
from support.namespaces import missing_for_namespaces
from support.processes import assert_nothing_left, free_ports
from support.runs import finish, start_example
from support.strategies import (assert_a_resumed_run_reads_its_data_in_an_order_of_its_own,
                                one_strategy_step)

EXAMPLE = "Sparse-Embeddings"


def sgd_graph(*argv, ps=3):
    """The algorithm's graph for worker 0 of a cluster of ps ps tasks (not started): a small
    table, a mini-batch of ids as a placeholder."""
    import tensorflow as tf
    module = load_train_module(EXAMPLE)
    args = module.parse_flags(["--rows", "1000", "--dim", "4"] + list(argv), module.example_flags)
    cluster = {"ps": ["localhost:%d" % (2000 + i) for i in range(ps)], "worker": ["localhost:3000"]}
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
        clicks = tf.compat.v1.placeholder(tf.float32, [None])
        sgd = module.build_sparse_sgd(args, cluster, ids, clicks)
    return module, sgd, graph


@pytest.mark.rule
def test_each_slice_of_each_table_sits_on_its_own_ps():
    _, sgd, _ = sgd_graph(ps=3)
    for name in ("embeddings", "linear"):
        slices = list(sgd.global_params[name])
        assert [s.device for s in slices] == ["/job:ps/task:%d" % p for p in range(3)], name
        assert sum(int(s.shape[0]) for s in slices) == 1000


@pytest.mark.rule
def test_the_pushed_gradient_is_row_sparse_and_dense_only_when_asked():
    import tensorflow as tf
    _, sgd, _ = sgd_graph()
    assert len(sgd.push) == 7  # 3 slices of each table, and the bias
    for gradient, variable in sgd.push:
        if variable.shape.rank == 0:  # the bias: one number
            continue
        assert isinstance(gradient, tf.IndexedSlices), variable.name
        # the rows pushed: one per id of the batch, never the slice's 334 rows
        assert gradient.values.shape.as_list()[0] is None, variable.name
    _, dense, _ = sgd_graph("--dense_gradients")
    for gradient, variable in dense.push:
        assert not isinstance(gradient, tf.IndexedSlices), variable.name
        assert gradient.shape.as_list() == variable.shape.as_list()  # as big as the slice


@pytest.mark.rule
def test_a_step_changes_only_the_rows_of_the_ids_in_its_batch():
    """One step of a worker on a real cluster of 2 ps (in this process): the rows of the
    batch's ids change in both tables, in whichever slice they sit; no other row does."""
    import tensorflow as tf
    module = load_train_module(EXAMPLE)
    ps0, ps1, worker = free_ports(3)
    cluster = {"ps": ["localhost:%d" % ps0, "localhost:%d" % ps1],
               "worker": ["localhost:%d" % worker]}
    spec = tf.compat.v1.train.ClusterSpec(cluster)
    servers = [tf.compat.v1.train.Server(spec, job_name=job, task_index=i, start=True)
               for job, i in (("ps", 0), ("ps", 1), ("worker", 0))]
    args = module.parse_flags(["--rows", "640", "--dim", "4", "--learning_rate", "1"],
                              module.example_flags)
    batch = np.array([[3, 100], [7, 100], [12, 631]], dtype=np.int64)  # user, item
    with tf.Graph().as_default() as graph:
        sgd = module.build_sparse_sgd(args, cluster, tf.constant(batch),
                                      tf.constant([1.0, 0.0, 1.0]))
        tables = {name: tf.concat(list(sgd.global_params[name]), axis=0)
                  for name in ("embeddings", "linear")}
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(servers[2].target, graph=graph) as session:
        session.run(init)
        before = session.run(tables)
        session.run(sgd.step)
        after = session.run(tables)
    touched = set(module.rows_of(batch, 640).ravel().tolist())
    assert len(touched) == 5 and {r // 320 for r in touched} == {0, 1}  # rows in both slices
    for name in tables:
        changed = np.nonzero(np.any((after[name] != before[name]).reshape(640, -1), axis=1))[0]
        assert set(changed.tolist()) == touched, name


@pytest.mark.rule
def test_every_slice_of_the_embeddings_starts_from_its_own_draw():
    """Three ps: no row of one slice starts equal to a row of another (one seed for every
    slice's initializer made rows r, r + R/3 and r + 2R/3 start alike)."""
    import tensorflow as tf
    module = load_train_module(EXAMPLE)
    ports = free_ports(4)
    cluster = {"ps": ["localhost:%d" % p for p in ports[:3]], "worker": ["localhost:%d" % ports[3]]}
    spec = tf.compat.v1.train.ClusterSpec(cluster)
    servers = [tf.compat.v1.train.Server(spec, job_name=job, task_index=i, start=True)
               for job, i in (("ps", 0), ("ps", 1), ("ps", 2), ("worker", 0))]
    args = module.parse_flags(["--rows", "600", "--dim", "4"], module.example_flags)
    with tf.Graph().as_default() as graph:
        sgd = module.build_sparse_sgd(args, cluster, tf.constant([[1, 2]], tf.int64),
                                      tf.constant([1.0]))
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(servers[3].target, graph=graph) as session:
        session.run(init)
        slices = session.run(list(sgd.global_params["embeddings"]))
    assert [s.shape for s in slices] == [(200, 4)] * 3
    table = np.concatenate(slices)
    assert len(np.unique(table, axis=0)) == 600, "rows of different slices start alike"
    assert 0.08 < table.std() < 0.12  # still N(0, 0.1)


@pytest.mark.rule
def test_the_hash_spreads_the_lookups_over_four_slices_within_20_percent():
    """Ids are numbered by popularity: without the hash, slice 0 of 4 would hold every user and
    the most popular items, and its ps would carry most of the traffic."""
    module = load_train_module(EXAMPLE)
    rows = 1000000
    data = module.make_clicks(rows, train_examples=200000, test_examples=10)
    hashed = np.bincount(module.rows_of(data.x_train, rows).ravel() // (rows // 4), minlength=4)
    assert np.all(np.abs(hashed / hashed.mean() - 1) < 0.2), hashed
    unhashed = np.bincount(data.x_train.ravel() // (rows // 4), minlength=4)
    assert unhashed[0] > 2 * unhashed.mean(), unhashed  # what the hash is for


def test_the_data_has_one_click_in_four_and_a_known_best_auc():
    module = load_train_module(EXAMPLE)
    data = module.make_clicks(1000000)
    assert 0.2 < data.y_train.mean() < 0.3
    order = np.argsort(data.best_scores)  # the rank-sum AUC of the noiseless scores
    ranks = np.empty(len(order))
    ranks[order] = np.arange(1, len(order) + 1)
    clicks = data.y_test == 1
    best = (ranks[clicks].sum() - clicks.sum() * (clicks.sum() + 1) / 2) / (
        clicks.sum() * (~clicks).sum())
    assert 0.85 < best < 0.95, best


@pytest.mark.parametrize("example", [EXAMPLE, "Sparse-Embeddings-TF2"])
def test_run_sh_with_its_defaults_pushes_sparse_gradients_on_the_same_data_every_run(
        example, default_runs):
    # clicks ranked above the bar, and every process's end: test_examples_end_to_end.py
    summary = default_runs[example].summary()
    assert summary["rows"] == "1000000" and int(summary["global_step"]) >= 2000
    assert abs(float(summary["best_auc"]) - 0.893) < 0.001, summary  # the same data every run
    if example == EXAMPLE:
        assert summary["gradients"] == "sparse"


@pytest.mark.rule
def test_a_checkpoint_of_2_slices_restores_into_2_or_3_with_every_row_where_its_id_looks(
        tmp_path):
    """The Saver keeps each table as one tensor and the lookup is "div", so restored into 2
    slices again or into 3, every id finds its row: the model's logits are the same to the bit
    (with "mod", an id's row depends on the number of slices, and 3 slices fail this)."""
    import tensorflow as tf
    module = load_train_module(EXAMPLE)
    ids = np.array([[u, 20 + 37 * u] for u in range(20)], dtype=np.int64)
    path = str(tmp_path / "tables.ckpt")

    def logits(slices, restore):
        with tf.Graph().as_default():
            with module.sharded_over_the_ps({"ps": ["localhost:1"] * slices}):
                params = module.model_params(1000, 4, seed=slices)
            assert len(list(params["embeddings"])) == slices
            logits = module.model_logits(params, ids)
            saver = tf.compat.v1.train.Saver()
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                saver.restore(session, path) if restore else saver.save(session, path)
                return session.run(logits)
    saved = logits(2, restore=False)
    np.testing.assert_array_equal(logits(2, restore=True), saved)
    np.testing.assert_array_equal(logits(3, restore=True), saved)


def test_run_sh_resumes_from_a_checkpoint_of_2_ps_on_3_and_trains_on(
        tmp_path):
    """2 ps train to 200 mini-batches; 3 ps resume from that checkpoint and train on to 300
    (the same number of ps resumes as every example does: the test above checks the rows).
    One worker: the slices are the point, and every process costs start-up time."""
    logs = str(tmp_path / "logs")

    def run(ps, steps):
        run = finish(start_example(EXAMPLE, ["--log_dir", logs, "--rows", "100000",
                                             "--log_every", "100", "--steps", str(steps)],
                                   env={"NUM_PS": str(ps), "NUM_WORKERS": "1"}), timeout=180)
        assert run.code == 0, run.output[-3000:]
        return run, run.summary()
    _, first = run(2, 200)
    assert (first["global_step"], first["ps"]) == ("200", "2")
    second_run, second = run(3, 300)
    assert "[worker0] resuming from the checkpoint at global step 200" in second_run.output
    assert (second["global_step"], second["updates"], second["ps"]) == ("300", "100", "3")
    assert float(second["test_auc"]) > 0.6
    assert_nothing_left(str(tmp_path))


def test_data_path_is_refused_in_one_line():
    code, _, stderr = run_train(EXAMPLE, ["--data_path", "mnist.npz", "--ps_hosts", "a:1",
                                          "--worker_hosts", "b:2", "--job_name", "ps"])
    assert code == 2 and error_lines(stderr) == [
        "error: --data_path: this example makes its own clicks; replace make_clicks with yours"]


def test_tensorflow_2_slices_each_table_over_the_ps_and_resumes_into_another_count(tmp_path):
    """Sparse-Embeddings-TF2: ShardedVariables from the strategy's variable_partitioner, a slice
    on each ps; the clicks ranked above chance; a checkpoint of 2 ps resumes on 3 and ranks the
    test pairs exactly as before, then trains on, every one of the 3 slices; every process ends
    by itself."""
    import tensorflow as tf
    logs = str(tmp_path / "logs")

    def run(ps, steps):
        run = finish(start_example("Sparse-Embeddings-TF2", [
            "--log_dir", logs, "--rows", "100000", "--steps", str(steps), "--log_every", "100"],
            env={"NUM_PS": str(ps), "NUM_WORKERS": "1"}), timeout=180)
        assert run.code == 0, run.output[-3000:]
        assert "[run.sh] all processes finished" in run.output
        return run, run.summary()

    def embeddings():  # the table in the newest checkpoint, whole
        reader = tf.train.load_checkpoint(logs)
        (key,) = [k for k in reader.get_variable_to_shape_map()
                  if k.startswith("embeddings/") and "OPTIMIZER" not in k]
        return reader.get_tensor(key)
    first_run, first = run(2, 300)
    assert "[chief0] embeddings [100000, 32] on /job:ps/replica:0/task:0, " \
        "/job:ps/replica:0/task:1" in first_run.output
    assert first["global_step"] == "300" and float(first["test_auc"]) > 0.6
    second_run, second = run(3, 300)
    assert "[chief0] embeddings [100000, 32] on /job:ps/replica:0/task:0, " \
        "/job:ps/replica:0/task:1, /job:ps/replica:0/task:2" in second_run.output
    assert "[chief0] resuming from the checkpoint at global step 300" in second_run.output
    assert second["updates"] == "0" and second["test_auc"] == first["test_auc"]
    restored = embeddings()
    third_run, third = run(3, 400)  # on the 3 slices, 100 mini-batches more
    assert "[chief0] resuming from the checkpoint at global step 300" in third_run.output
    assert third["updates"] == "100" and third["global_step"] == "400"
    assert float(third["test_auc"]) > 0.6 and third["test_auc"] != second["test_auc"]
    changed = np.nonzero(np.any(embeddings() != restored, axis=1))[0]
    assert set(np.unique(changed * 3 // 100000).tolist()) == {0, 1, 2}, \
        "rows changed in the slices %s of 3" % sorted(set(changed * 3 // 100000))
    assert_nothing_left(str(tmp_path))


@pytest.mark.rule
def test_tensorflow_2_a_step_changes_only_the_rows_looked_up_in_both_slices():
    """Sparse-Embeddings-TF2: one scheduled step on a table of 2 slices over 2 ps changes, in
    each table, exactly the rows of the mini-batch's ids, in whichever slice they sit."""
    (step,) = one_strategy_step("Sparse-Embeddings-TF2", ",".join(map(str, free_ports(4))))
    assert str(step["error"]) == "" and int(step["slices"]) == 2
    rows = int(step["rows"])
    touched = set(load_train_module(EXAMPLE).rows_of(step["ids"], rows).ravel().tolist())
    assert {r // (rows // 2) for r in touched} == {0, 1}  # rows in both slices
    for name in ("embeddings", "linear"):
        moved = step["after_" + name] != step["before_" + name]
        changed = np.nonzero(moved.reshape(rows, -1).any(axis=1))[0]
        assert set(changed.tolist()) == touched, name


def test_tensorflow_2_a_resumed_run_reads_the_pairs_in_an_order_of_its_own():
    assert_a_resumed_run_reads_its_data_in_an_order_of_its_own("Sparse-Embeddings-TF2")


@pytest.mark.rule
def test_tensorflow_2_a_table_slice_with_a_dense_gradient_fails_loudly():
    """A model that reads a table whole gives its slices dense gradients: each step would move
    every row of the table. The step refuses it in one message naming the slice."""
    (step,) = one_strategy_step("Sparse-Embeddings-TF2", ",".join(map(str, free_ports(4))),
                                "dense")
    error = str(step["error"])
    assert "TypeError: the gradient of table slice embeddings/part_0" in error and \
        "tf.nn.embedding_lookup" in error, error
    np.testing.assert_array_equal(step["after_embeddings"], step["before_embeddings"])


@pytest.mark.benchmark
@pytest.mark.cluster
@pytest.mark.skipif(missing_for_namespaces() is not None, reason=missing_for_namespaces() or "")
@pytest.mark.timeout(900)
def test_sparse_pushes_move_at_least_100_times_fewer_bytes_than_dense_ones(tmp_path):
    """benchmarks/sparse_embeddings.py's first table, at the default 1M x 32 table."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import sparse_embeddings
    args = sparse_embeddings.parser().parse_args(["--out", str(tmp_path)])
    sparse, _ = sparse_embeddings.bytes_per_mini_batch(args, "sparse", 300, [])
    dense, _ = sparse_embeddings.bytes_per_mini_batch(args, "dense", 5, ["--dense_gradients"])
    assert dense / sparse >= 100, (sparse, dense)

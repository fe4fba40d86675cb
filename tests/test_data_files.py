"""Data of a distributed job's size: --data_path's TFRecord files (tools/npz_to_tfrecord.py),
each worker reading files of its own and the chief streaming the test files; an .npz that never
becomes a constant of the graph; and the number of classes taken from the labels."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from support.examples import (ROOT, error_lines, load_train_module, run_train,
                              run_train_noting_tensorflow)
from support.runs import run_example

CONVERTER = os.path.join(ROOT, "tools", "npz_to_tfrecord.py")
CLUSTER = ["--job_name", "worker", "--ps_hosts", "localhost:1", "--worker_hosts", "localhost:2"]


def numbered_set(path, train=96, test=30):
    """An .npz whose every example says its own number: x is (number mod 256, number // 256,
    then zeros) as uint8 pixels of a 4x4 image, the label its number mod 3."""
    def examples(first, count):
        x = np.zeros((count, 4, 4), np.uint8)
        numbers = np.arange(first, first + count)
        x[:, 0, 0], x[:, 0, 1] = numbers % 256, numbers // 256
        return x, numbers % 3
    (x_train, y_train), (x_test, y_test) = examples(0, train), examples(train, test)
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    return path


def convert(npz, folder, *args):
    proc = subprocess.run([sys.executable, CONVERTER, str(npz), str(folder)] + list(args),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return folder


def number_of(x, scale):
    """The example's number, back from its scaled pixels."""
    pixels = np.rint(np.asarray(x).reshape(-1) * scale).astype(int)
    return int(pixels[0] + 256 * pixels[1])


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    folder = tmp_path_factory.mktemp("records")
    npz = numbered_set(folder / "numbered.npz")
    convert(npz, folder / "shards", "--shards", "4", "--test_shards", "2")
    return folder / "shards"


def test_the_converter_writes_every_example_once_and_says_the_layout_in_meta_json(records):
    meta = json.loads((records / "meta.json").read_text())
    assert meta == dict(x_shape=[4, 4, 1], x_dtype="uint8", x_scale=95.0,  # x_train's largest
                        num_classes=3, train_examples=96, test_examples=30)
    assert sorted(p.name for p in records.iterdir()) == [
        "meta.json", "test-00000-of-00002.tfrecord", "test-00001-of-00002.tfrecord"] + [
        "train-%05d-of-00004.tfrecord" % k for k in range(4)]


def test_each_worker_reads_only_its_own_files_and_together_they_read_every_example(records):
    # two workers of four files: worker k reads files k and k + 2, so the examples whose number
    # mod 4 is k or k + 2 (the converter deals them round-robin), and nothing of the other's
    module = load_train_module("Distributed-Setup")
    tf = module.tf
    data = module.load_dataset(str(records))
    seen = {}
    for worker in (0, 1):
        with tf.Graph().as_default():
            x, y = module.training_batches(data, 8, worker, 2, seed=0)
            with tf.compat.v1.Session() as session:
                module.start_the_data(session, 0)
                batches = [session.run([x, y]) for _ in range(12)]  # two epochs of its 48
        numbers = [number_of(row, data.x_scale) for xs, _ in batches for row in xs]
        labels = [int(label) for _, ys in batches for label in ys]
        assert labels == [n % 3 for n in numbers]  # each example's label came with it
        seen[worker] = set(numbers)
    assert seen[0] == {n for n in range(96) if n % 4 in (0, 2)}
    assert seen[1] == {n for n in range(96) if n % 4 in (1, 3)}


def test_every_epoch_of_a_workers_tfrecord_files_comes_in_a_new_order(records):
    # each of two workers reads its two files, 48 examples an epoch: every one of them in each
    # epoch, and the second epoch in an order of its own (files and records reshuffled)
    module = load_train_module("Distributed-Setup")
    tf = module.tf
    data = module.load_dataset(str(records))
    for worker in (0, 1):
        with tf.Graph().as_default():
            x, _ = module.training_batches(data, 8, worker, 2, seed=0)
            with tf.compat.v1.Session() as session:
                module.start_the_data(session, 0)
                numbers = [number_of(row, data.x_scale) for _ in range(12)
                           for row in session.run(x)]
        first, second = numbers[:48], numbers[48:]
        assert sorted(first) == sorted(second) == sorted(set(first)) and len(first) == 48
        assert first != second, "worker %d read its files in the same order twice" % worker


def test_the_test_files_stream_in_batches_of_the_size_asked_holding_the_whole_test_set(records):
    module = load_train_module("Distributed-Setup")
    data = module.load_dataset(str(records))
    batches = [(x.numpy(), y.numpy()) for x, y in data.test_batches(8)]  # eagerly, here
    assert [len(x) for x, _ in batches] == [8, 8, 8, 6]  # 15 in each file, read in turn
    numbers = [number_of(row, data.x_scale) for x, _ in batches for row in x]
    assert sorted(numbers) == list(range(96, 126))
    assert all(x.dtype == np.float32 and x.shape[1:] == (4, 4, 1) for x, _ in batches)
    assert [int(v) for _, y in batches for v in y] == [n % 3 for n in numbers]


def test_two_workers_train_from_tfrecord_shards_each_naming_the_files_it_reads(tmp_path):
    from sklearn.datasets import load_digits
    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    x, y = digits.images.astype(np.uint8)[order], digits.target[order]
    np.savez(tmp_path / "digits.npz", x_train=x[:1440], y_train=y[:1440], x_test=x[1440:],
             y_test=y[1440:])
    folder = convert(tmp_path / "digits.npz", tmp_path / "digits", "--shards", "4")
    run = run_example("Distributed-Setup", tmp_path, "--data_path", str(folder), "--steps", "600")
    assert run.code == 0, run.output[-3000:]
    read = {}
    for line in run.output.splitlines():
        if "training files:" in line:  # [workerK] reading training files: a,b
            read[line.split("]")[0][1:]] = line.rsplit(": ", 1)[1].split(",")
    assert sorted(read) == ["worker0", "worker1"], run.output[-3000:]
    assert not set(read["worker0"]) & set(read["worker1"])
    assert sorted(read["worker0"] + read["worker1"]) == sorted(
        p.name for p in folder.iterdir() if p.name.startswith("train-"))
    assert float(run.summary()["test_accuracy"]) >= 0.85


def test_a_folder_of_fewer_training_files_than_workers_is_refused_in_one_line(tmp_path):
    folder = convert(numbered_set(tmp_path / "n.npz"), tmp_path / "one", "--shards", "1")
    run = run_example("Distributed-Setup", tmp_path, "--data_path", str(folder), "--steps", "50")
    assert run.code != 0
    assert "error: 1 training file(s) for 2 workers: each worker reads files of its own" in (
        run.output), run.output[-2000:]


@pytest.mark.parametrize("problem, message", [
    ("no meta.json", "is no folder of TFRecord files ([Errno 2] No such file or directory"),
    ("no training files", "is no folder of TFRecord files (no train-*.tfrecord files)"),
])
def test_malformed_tfrecord_files_are_refused_in_one_line_before_tensorflow_loads(
        records, tmp_path, problem, message):
    folder = tmp_path / "copy"
    folder.mkdir()
    for path in records.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    if problem == "no meta.json":
        (folder / "meta.json").unlink()
    else:
        for path in folder.glob("train-*"):
            path.unlink()
    code, _, stderr, loaded = run_train_noting_tensorflow(
        "Distributed-Setup", CLUSTER + ["--data_path", str(folder)])
    assert code == 2 and not loaded, stderr
    assert len(error_lines(stderr)) == 1 and message in stderr, stderr


def test_a_hundred_classes_train_with_no_code_changed(tmp_path):
    # the number of classes comes from the labels: 100 learnable classes (a template each, plus
    # noise) in one process, far above the 1% that guessing reaches
    rng = np.random.default_rng(0)
    templates = rng.normal(size=(100, 32))
    labels = rng.integers(0, 100, 4000)
    x = (templates[labels] + 0.3 * rng.normal(size=(4000, 32))).astype(np.float32)
    np.savez(tmp_path / "hundred.npz", x_train=x[:3000], y_train=labels[:3000],
             x_test=x[3000:], y_test=labels[3000:])
    code, stdout, stderr = run_train("Non-Distributed-Setup", [
        "--data_path", str(tmp_path / "hundred.npz"), "--steps", "600", "--log_dir",
        str(tmp_path / "logs")], timeout=120)
    assert code == 0, stderr[-2000:]
    summary = [l for l in stdout.splitlines() if " summary " in l][0]
    assert float(summary.split("test_accuracy=")[1].split()[0]) > 0.5, summary


def test_an_npz_reaches_each_worker_as_its_own_shard_and_never_as_a_constant_of_the_graph(
        tmp_path):
    # 4000 numbered examples of 1024 float32 (16 MB): the graph stays small, and worker k of 2
    # trains on the examples whose number mod 2 is k, every one of them in an epoch
    x = np.zeros((4000, 1024), np.float32)
    x[:, 0] = np.arange(4000)
    np.savez(tmp_path / "big.npz", x_train=x, y_train=np.arange(4000) % 7, x_test=x[:10],
             y_test=np.arange(10) % 7)
    module = load_train_module("Distributed-Setup")
    tf = module.tf
    data = module.load_dataset(str(tmp_path / "big.npz"))
    assert data.num_classes == 7
    for worker in (0, 1):
        with tf.Graph().as_default() as graph:
            x_batch, _ = module.training_batches(data, 100, worker, 2, seed=0)
            assert graph.as_graph_def().ByteSize() < 100000  # the arrays are 16 MB
            with tf.compat.v1.Session() as session:
                module.start_the_data(session, 0)
                numbers = {int(n) for _ in range(20) for n in session.run(x_batch)[:, 0]}
        assert numbers == set(range(worker, 4000, 2))


# --- What reaches the model: scaled pixels, every class, a new order every epoch and session ------
def stream(module, data, worker, num_workers, batch_size, batches, start_step=0):
    """Worker's first batches of its graph pipeline (training_batches), its session started at
    the global step start_step as the examples start it (start_the_data): [(x, y), ...]."""
    tf = module.tf
    with tf.Graph().as_default():
        x, y = module.training_batches(data, batch_size, worker, num_workers, seed=0)
        with tf.compat.v1.Session() as session:
            module.start_the_data(session, start_step)
            return [session.run([x, y]) for _ in range(batches)]


def test_integer_pixels_reach_the_model_scaled_by_the_training_sets_largest_value(tmp_path):
    # the numbered set's pixels are uint8, the largest in x_train 95 (example 95): what the
    # graph's pipeline yields, not only what read_npz returns, is each pixel / 95
    module = load_train_module("Distributed-Setup")
    data = module.load_dataset(str(numbered_set(tmp_path / "n.npz")))
    batches = stream(module, data, 0, 1, 16, 6)  # one epoch of 96
    x = np.concatenate([xs for xs, _ in batches])
    assert x.dtype == np.float32 and x.shape == (96, 4, 4, 1)
    assert x.min() == 0.0 and x.max() == 1.0
    numbers = x[:, 0, 0, 0] * 95  # the example's number, its first pixel
    np.testing.assert_allclose(numbers, np.rint(numbers), atol=1e-4)
    assert sorted(np.rint(numbers).astype(int)) == list(range(96))
    labels = np.concatenate([ys for _, ys in batches])
    assert list(labels) == [int(n) % 3 for n in np.rint(numbers)]


def test_the_test_sets_integer_pixels_reach_the_chiefs_metrics_scaled_as_in_training(tmp_path):
    # the test examples are numbers 96-125, pixels of x_train's scale (95): fed to the metrics
    # as float32, each first pixel is its number / 95, so their mean is 110.5 / 95
    import tensorflow as tf
    module = load_train_module("Distributed-Setup")
    data = module.load_dataset(str(numbered_set(tmp_path / "n.npz")))
    with tf.Graph().as_default():
        test_set = module.test_metrics_of(lambda x, y: {
            "first_pixel": tf.reduce_mean(x[:, 0, 0, 0]),
            "float32": tf.constant(float(x.dtype == tf.float32))}, data)
        with tf.compat.v1.Session() as session:
            got = module.mean_over_the_test_set(session, *test_set)
    assert got == {"first_pixel": pytest.approx(110.5 / 95, abs=1e-6), "float32": 1.0}


def test_the_number_of_classes_counts_the_test_sets_labels_too(tmp_path):
    # the training labels are 0-2, a test label is 4: the model needs 5 outputs, from an .npz
    # and from the TFRecord files the converter writes of it
    x = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
    np.savez(tmp_path / "more.npz", x_train=x[:30], y_train=np.arange(30) % 3,
             x_test=x[30:], y_test=np.array([0, 1, 2, 4, 0, 1, 2, 0, 1, 2]))
    module = load_train_module("Distributed-Setup")
    assert module.load_dataset(str(tmp_path / "more.npz")).num_classes == 5
    folder = convert(tmp_path / "more.npz", tmp_path / "more", "--shards", "2")
    assert module.load_dataset(str(folder)).num_classes == 5


def test_each_workers_shard_of_an_npz_comes_in_a_new_order_every_epoch_and_every_session(
        tmp_path):
    ids = np.arange(40)
    x = ids.reshape(-1, 1).astype(np.float32)  # the example's id as its one feature
    module = load_train_module("Distributed-Setup")
    data = module.Dataset(x, ids, x[:1], ids[:1], num_classes=40)
    orders = {}
    for worker in (0, 1):  # 20 examples each, 4 batches of 5 an epoch
        ids_seen = [int(i) for xs, _ in stream(module, data, worker, 2, 5, 8) for i in xs[:, 0]]
        first, second = ids_seen[:20], ids_seen[20:]
        shard = list(range(worker, 40, 2))
        assert sorted(first) == shard and sorted(second) == shard  # each epoch: the whole shard
        assert first != second, "the second epoch repeats the first's order"
        orders[worker] = [i // 2 for i in first]  # the order, as positions in the shard
    assert orders[0] != orders[1], "both workers draw their shards in the same order"
    # a session that starts later in the run (a restart, a resume) draws an order of its own,
    # and one that starts at the same global step draws the same (a rerun repeats)
    later = [int(i) for xs, _ in stream(module, data, 0, 2, 5, 4, start_step=300)
             for i in xs[:, 0]]
    assert sorted(later) == list(range(0, 40, 2)) and later != orders[0]
    again = [int(i) for xs, _ in stream(module, data, 0, 2, 5, 4, start_step=300)
             for i in xs[:, 0]]
    assert again == later


def test_a_restarted_chief_does_not_replay_the_mini_batches_the_run_began_with(records, tmp_path):
    # the chief's session as its Worker makes it, on a real in-process cluster; then the chief
    # restarts (a new graph, a new Worker) while the ps keeps the variables at global step 300:
    # its new session starts its stream at step 300, not at the run's first batches
    from support.in_process import flags, in_process_cluster
    module = load_train_module("Distributed-Setup")
    tf = module.tf
    data = module.load_dataset(str(records))
    cluster, (server,) = in_process_cluster()
    args = flags(module, "--log_dir", str(tmp_path / "logs"), "--batch_size", "16")
    args.job_name, args.task_index, args.connect_timeout = "worker", 0, 10.0
    first_batches = []
    for attempt in range(2):
        with tf.Graph().as_default():
            xs, ys = module.training_batches(data, args.batch_size, 0, 1, args.seed)
            with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
                    cluster=cluster, worker_device="/job:worker/task:0")):
                sgd = module.build_sgd(args, tf.reshape(xs, [-1, 16]), ys, 3)
            worker = module.Worker(args, cluster, lambda x, y: {}, data)
            session = worker.session(server, sgd.loss, sgd.step)._tf_sess()
            first_batches.append(sorted(number_of(x, data.x_scale) for x in session.run(xs)))
            if attempt == 0:
                sgd.global_step.load(300, session)
            else:
                assert session.run(sgd.global_step) == 300  # the ps kept the run
    assert first_batches[0] != first_batches[1], "the restarted chief replayed its first batch"


def test_a_traced_dataset_function_holds_pixels_as_bytes_and_refuses_arrays_over_its_limit(
        tmp_path, capsys, monkeypatch):
    # ParameterServerStrategy traces its dataset function: the arrays become a constant of that
    # graph, which every worker holds; uint8 pixels go in as bytes (not 4 bytes of float32 each)
    # and are scaled in the pipeline, and arrays over ARRAYS_IN_A_GRAPH_MB are refused in one line
    x = (np.arange(2000 * 64) % 251).astype(np.uint8).reshape(2000, 8, 8)
    np.savez(tmp_path / "pixels.npz", x_train=x, y_train=np.arange(2000) % 10, x_test=x[:10],
             y_test=np.arange(10) % 10)
    module = load_train_module("ParameterServerStrategy")
    tf = module.tf
    data = module.load_dataset(str(tmp_path / "pixels.npz"))
    dataset_fn = lambda: module.training_dataset(data, 10, 0, 2, seed=0)
    graph = tf.function(dataset_fn).get_concrete_function().graph
    constants = [op.get_attr("value") for op in graph.get_operations() if op.type == "Const"]
    largest = max(constants, key=lambda c: len(c.tensor_content))
    assert tf.as_dtype(largest.dtype) == tf.uint8 and len(largest.tensor_content) == x.nbytes
    first = next(iter(dataset_fn()))[0].numpy()  # eagerly (MultiWorkerMirroredStrategy's way)
    assert first.dtype == np.float32 and 0 <= first.min() and first.max() <= 1

    monkeypatch.setattr(module, "ARRAYS_IN_A_GRAPH_MB", 0.1)  # the pixels are 0.125 MB
    next(iter(dataset_fn()))  # eagerly: no constant of a graph, no limit
    with pytest.raises(SystemExit) as exit:
        tf.function(dataset_fn).get_concrete_function()
    stderr = capsys.readouterr().err
    assert exit.value.code == 2 and error_lines(stderr) == stderr.splitlines(), stderr
    assert ("0 MB of training arrays would be a constant of the traced dataset function, on "
            "every worker (at most 0 MB): write them as TFRecord files") in stderr, stderr


def run_converter(npz, folder, *args):
    """The converter's exit code and stderr."""
    proc = subprocess.run([sys.executable, CONVERTER, str(npz), str(folder)] + list(args),
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stderr


def test_the_converter_refuses_a_folder_that_holds_a_data_set_already_and_leaves_it_as_it_was(
        tmp_path):
    # --shards 2 then --shards 4 into one folder would leave six training files, which the
    # reader takes together: every example twice, split unevenly
    npz = numbered_set(tmp_path / "n.npz")
    folder = convert(npz, tmp_path / "shards", "--shards", "2")
    before = sorted(p.name for p in folder.iterdir())
    code, stderr = run_converter(npz, folder, "--shards", "4")
    assert code == 2 and error_lines(stderr) == stderr.splitlines(), stderr
    assert "%s holds a data set already (meta.json, test-00000-of-00001.tfrecord, " % folder in (
        stderr) and "write into a new folder, or remove its files first" in stderr, stderr
    assert sorted(p.name for p in folder.iterdir()) == before


def test_the_converters_default_shards_divide_evenly_over_1_2_3_4_6_and_8_workers(tmp_path):
    folder = convert(numbered_set(tmp_path / "n.npz"), tmp_path / "shards")
    shards = len(list(folder.glob("train-*.tfrecord")))
    assert shards == 24 and all(shards % workers == 0 for workers in (1, 2, 3, 4, 6, 8))


@pytest.mark.parametrize("problem, message", [
    ("nan", "x_train has NaN or infinite values"),
    ("infinite", "x_test has NaN or infinite values"),
    ("nan target", "y_train has NaN or infinite values"),
    ("dtypes", "x_test is float64 and x_train float32: save both in one dtype"),
])
def test_the_converter_refuses_what_the_npz_path_refuses_in_one_line(tmp_path, problem, message):
    rng = np.random.default_rng(0)
    arrays = dict(x_train=rng.random((20, 3)).astype(np.float32), y_train=rng.random(20),
                  x_test=rng.random((5, 3)).astype(np.float32), y_test=rng.random(5))
    if problem == "nan":
        arrays["x_train"][4, 2] = np.nan
    elif problem == "infinite":
        arrays["x_test"][0, 0] = -np.inf
    elif problem == "nan target":
        arrays["y_train"][7] = np.nan
    else:
        arrays["x_test"] = arrays["x_test"].astype(np.float64)
    np.savez(tmp_path / "bad.npz", **arrays)
    code, stderr = run_converter(tmp_path / "bad.npz", tmp_path / "out", "--shards", "2",
                                 "--regression")
    assert code == 2 and error_lines(stderr) == stderr.splitlines(), stderr
    assert message in stderr and not (tmp_path / "out").exists(), stderr


def test_big_endian_arrays_are_written_little_endian_as_the_reader_decodes_them(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 3)).astype(">f4")  # big-endian floats, as another machine saves
    np.savez(tmp_path / "big_endian.npz", x_train=x[:8], y_train=np.arange(8) % 2, x_test=x[8:],
             y_test=np.arange(4) % 2)
    folder = convert(tmp_path / "big_endian.npz", tmp_path / "shards", "--shards", "2")
    module = load_train_module("Distributed-Setup")
    data = module.load_dataset(str(folder))
    (x_test, _), = list(data.test_batches(10))
    np.testing.assert_array_equal(x_test.numpy(), x[8:].astype(np.float32))
    tf = module.tf
    with tf.Graph().as_default():
        x_batch, _ = module.training_batches(data, 4, 0, 1, seed=0)
        with tf.compat.v1.Session() as session:
            module.start_the_data(session, 0)
            rows = np.concatenate([session.run(x_batch) for _ in range(2)])
    assert sorted(map(tuple, rows)) == sorted(map(tuple, x[:8].astype(np.float32)))

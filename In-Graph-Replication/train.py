"""In-Graph-Replication: one client, one graph, a copy of the model (a tower) on every device.

What it teaches
    The other way to use several devices for data parallelism. Between-graph replication (the
    examples on a ps) starts one client per worker, each with its own graph. Here one client
    builds one graph that holds a tower per device: the GPUs of this machine, or logical CPU
    devices when it has none, or the devices of every worker task of a cluster. One input
    pipeline on the controller device reads a mini-batch and splits it, so each tower gets a
    different slice; each tower computes its gradients on its own device; the controller
    averages them and applies one update. With equal slices the average is exactly the
    gradient of the whole mini-batch, so the towers only split the work: the training is the
    same as on one device. tf.distribute.MirroredStrategy automates all of this (README.md).

The update rule (each step; N towers, a mini-batch of B examples)
    x_1 .. x_N <- split(next mini-batch, N)              # on the controller; B/N examples each
    g_i        <- grad L(params; x_i)                    # on tower i's device
    params     <- params - learning_rate * (g_1 + ... + g_N) / N     # once, on the controller

Run it
    python train.py --devices 2      # alone: 2 towers on 2 devices of this process
    bash run.sh                      # 2 worker tasks on localhost, a tower on each; worker 0
                                     # is the client, worker 1 only serves its device
    NUM_WORKERS=3 bash run.sh --devices 2 --batch_size 60   # 3 tasks x 2 devices: 6 towers
    By hand, one terminal per task (the same flags but the index):
      H="--worker_hosts h0:2222,h1:2222"
      python train.py --task_index 1 $H       # on h1: serves until worker 0 is done
      python train.py --task_index 0 $H       # on h0: the client; drives h1's tower too
    Or set TF_CONFIG (a "worker" job only) and give no flags.

Use your own model
    Replace the two sections marked "(replace with your own)": Data (load_dataset) and Model
    (model_params, model_loss, model_metrics). --batch_size must
    be divisible by the number of towers.

References
    The CIFAR-10 multi-GPU tutorial of TensorFlow 1 (cifar10_multi_gpu_train.py: towers, and
    gradients averaged on the CPU); M. Abadi et al., "TensorFlow: A system for large-scale
    machine learning", OSDI 2016, section 4.4 (in-graph and between-graph replication).
"""
import argparse
import collections
import glob
import json
import os
import socket
import sys
import time

import numpy as np

tf = None  # loaded once the flags are checked: bad input fails in one line, at once
EXAMPLE = "In-Graph-Replication"
JOBS = ("worker",)  # worker 0 is the client, and drives every task; deploy/ and the tests read it


def example_flags(parser):
    parser.add_argument("--devices", type=positive_int, default=1,
                        help="devices with a tower on each worker task (on this process, when "
                             "it runs alone): its GPUs if it has that many, else logical CPUs")
    parser.add_argument("--step_timeout", type=positive_float, default=30,
                        help="seconds a step may wait for the workers: a lost one ends the run")


# --- Data (replace with your own) -----------------------------------------------------------------
# >>> shared: data
Dataset = collections.namedtuple("Dataset", "x_train y_train x_test y_test num_classes x_scale",
                                 defaults=[1.0])  # x_scale: integer pixels are divided by it


def load_dataset(data_path=""):
    """By default scikit-learn's 1797 handwritten 8x8 digits (offline; a fixed fifth to test),
    rows of 64 pixels in [0, 1], labels 0-9; or data_path's, checked below the banner."""
    if data_path:  # an .npz (read_npz), or a folder of TFRecord files (read_records)
        return Dataset(*read_npz(data_path)) if data_path.endswith(".npz") else read_records(
            data_path)
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0,
                                                        stratify=y)
    return Dataset((x_train / 16).astype(np.float32), y_train.astype(np.int64),
                   (x_test / 16).astype(np.float32), y_test.astype(np.int64), num_classes=10)


def training_dataset(data, batch_size, worker_index, num_workers, seed):
    """This worker's endless stream of mini-batches: its own shard, reshuffled every epoch."""
    if isinstance(data, Records):  # files: this worker reads files of its own
        return records_dataset(data, batch_size, worker_index, num_workers, seed)
    ds = arrays_dataset(data.x_train, data.y_train, worker_index, num_workers, seed, data.x_scale)
    return ds.repeat().batch(batch_size, drop_remainder=True).prefetch(2)
# <<< shared: data


# >>> shared: graph batches
def training_batches(data, batch_size, worker_index, num_workers, seed):
    """The next mini-batch of training_dataset, tensors of the graph: see session_stream."""
    return session_stream(lambda session_seed: training_dataset(
        data, batch_size, worker_index, num_workers, session_seed), seed, worker_index)
# <<< shared: graph batches


# --- Model (replace with your own) ----------------------------------------------------------------
# >>> shared: model
def model_params(input_shape, hidden, seed, num_classes=10):
    """The MLP's variables, made under the current device scope (the ps, in the examples), for
    examples of input_shape (a row of features, or an image that the MLP reads as one row)."""
    glorot = lambda i: tf.compat.v1.glorot_uniform_initializer(seed=seed * 10 + i)
    zeros = tf.compat.v1.zeros_initializer()
    features = int(np.prod(input_shape))
    return {"w1": tf.compat.v1.get_variable("w1", [features, hidden], initializer=glorot(1)),
            "b1": tf.compat.v1.get_variable("b1", [hidden], initializer=zeros),
            "w2": tf.compat.v1.get_variable("w2", [hidden, num_classes], initializer=glorot(2)),
            "b2": tf.compat.v1.get_variable("b2", [num_classes], initializer=zeros)}


def model_logits(params, x):
    rows = tf.reshape(x, [-1, int(np.prod(x.shape[1:]))])  # an image becomes one row
    hidden = tf.nn.relu(tf.matmul(rows, params["w1"]) + params["b1"])
    return tf.matmul(hidden, params["w2"]) + params["b2"]


def model_loss(params, x, y):
    """What training minimises: the mean cross-entropy over a mini-batch."""
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=y, logits=model_logits(params, x)))


def model_metrics(params, x, y):
    """What the chief reports on the test set, by name: each a mean over a batch of examples."""
    correct = tf.equal(tf.argmax(model_logits(params, x), 1), y)
    return {"accuracy": tf.reduce_mean(tf.cast(correct, tf.float32))}
# <<< shared: model


# --- The algorithm --------------------------------------------------------------------------------
Towers = collections.namedtuple("Towers", "params global_step x_slices tower_gradients "
                                "mean_gradients loss step")


def build_towers(args, devices, controller, x, y, num_classes=10):
    """One synchronous step over a tower per device, on the mini-batch (x, y).

    The variables, the split and the average live on the controller device; a tower reads the
    variables (a copy to its device), and its forward and backward pass run on its device
    (tf.gradients places each gradient op beside the op it differentiates).
    """
    with tf.compat.v1.device(controller):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        params = model_params(x.shape[1:], args.hidden, args.seed, num_classes)  # one copy, shared
        x_slices = tf.split(x, len(devices))  # a different slice for every tower: feeding
        y_slices = tf.split(y, len(devices))  # each the whole batch would repeat the work
    tower_losses, tower_gradients = [], []
    for i, device in enumerate(devices):
        with tf.compat.v1.device(device), tf.compat.v1.name_scope("tower%d" % i):
            loss = model_loss(params, x_slices[i], y_slices[i])
            tower_losses.append(loss)
            tower_gradients.append(tf.gradients(loss, list(params.values())))
    with tf.compat.v1.device(controller), tf.compat.v1.name_scope("controller"):
        mean_gradients = [tf.add_n(list(g)) / len(devices) for g in zip(*tower_gradients)]
        loss = tf.add_n(tower_losses) / len(devices)
        update = tf.compat.v1.train.GradientDescentOptimizer(args.learning_rate).apply_gradients(
            zip(mean_gradients, params.values()), global_step=global_step)
        with tf.control_dependencies([update]):
            step = global_step.read_value()  # one update; its value: the global step after it
    return Towers(params, global_step, x_slices, tower_gradients, mean_gradients, loss, step)


# --- The training loop ----------------------------------------------------------------------------
def train(args, cluster, target, data):
    """The client's loop: one graph, run on this process alone or on the cluster (target)."""
    devices, controller = run_devices(args, cluster)  # a tower on each device
    with tf.compat.v1.device(controller):  # one input pipeline, on the controller
        x, y = training_batches(data, args.batch_size, 0, 1, args.seed)
    towers = build_towers(args, devices, controller, x, y, data.num_classes)
    with tf.compat.v1.device(controller):  # the test metrics, too
        client = Client(args, cluster, lambda x, y: model_metrics(towers.params, x, y),
                        data)
    session = client.start(target, devices)
    while client.step < args.steps:
        client.after_update(session, *session.run([towers.loss, towers.step]))
    return client.end(session, towers=len(devices))


def main(argv=None):
    args = parse_flags(argv, example_flags)  # bad input fails here, before TensorFlow loads
    cluster = resolve_workers(args)
    towers = args.devices * (len(cluster["worker"]) if cluster else 1)
    if args.batch_size % towers:
        fail("--batch_size %d cannot be split over %d towers: give a multiple of %d"
             % (args.batch_size, towers, towers))
    data = load_dataset(args.data_path) if args.task_index == 0 else None  # the client needs it
    return run_task(args, cluster, train, data)


# ==================================================================================================
# Plumbing shared by every example (what a job needs besides its algorithm)
# ==================================================================================================
# What the client of a cluster, and the tasks it drives, need besides the algorithm, in this order;
# the same text in every train.py with one client (a test keeps the copies equal):
#   1. flags, and the workers from them or from TF_CONFIG (neither:
#      this process alone); --data_path's file, checked           parse_flags, resolve_workers,
#                                                                  check_cluster, number_type,
#                                                                  read_npz, Pixels, as_float32,
#                                                                  port_taken
#   2. TensorFlow loads after the checks; this task's server and
#      its devices; a failure ends the task in one line           run_task, task_config, fail,
#                                                                  cause
#   3. the other workers serve the client's graph until it says
#      the run is over                                            serve, run_over_flag, wait_for,
#                                                                  is_listening
#   4. the devices that carry the model, and the controller        run_devices
#   5. the client's session, once every worker answers; the
#      variables initialised or restored                           Client.start
#   6. progress lines, checkpoints, the test metrics over the
#      test set in batches, TensorBoard                            after_update, save, evaluate,
#                                                                  test_metrics_in_batches,
#                                                                  tensorboard_summary
#   7. the summary line                                            end, print_summary
#   8. the data's way in: TFRecord files; arrays that are no       read_records, check_shards,
#      constant of the graph; the test set in batches; each       count_records, records_dataset,
#      session's order of the training stream; a Keras model's    parse_records, arrays_dataset,
#      weights as the parameters                                  example_shape, test_batches,
#                                                                  record_batches, session_stream,
#                                                                  start_the_data, keras_params,
#                                                                  keras_logits
# >>> shared: flags
def fail(message):
    """One line on stderr and exit status 2: for bad input and lost peers, never for bugs."""
    print("error: " + message, file=sys.stderr, flush=True)
    sys.exit(2)


def number_type(kind, positive):
    """A flag's type: a number of kind, more than 0 if positive, else 0 or more (NaN neither)."""
    def parse(text):
        value = kind(text)  # not a number: a ValueError, and argparse says "invalid ... value"
        if not (value > 0 if positive else value >= 0):
            raise argparse.ArgumentTypeError("must be %s, got %s"
                                             % ("positive" if positive else "0 or more", text))
        return value
    parse.__name__ = ("positive_" if positive else "non_negative_") + kind.__name__
    return parse


positive_int, positive_float = number_type(int, True), number_type(float, True)
non_negative_int, non_negative_float = number_type(int, False), number_type(float, False)


def parse_flags(argv, example_flags):
    """The flags every example shares (a cluster's, where JOBS names one), then its own."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.error = lambda message: fail(  # "--steps must be positive, got 0", or argparse's words
        message.replace("argument ", "", 1).replace(": must be", " must be")
        if ": must be" in message else message + " (see --help)")
    common = [
        ("steps", positive_int, 2000, "mini-batches to train, summed over the workers"),
        ("batch_size", positive_int, 64, "examples per mini-batch"),
        ("learning_rate", positive_float, 0.1, "the workers' learning rate"),
        ("hidden", positive_int, 128, "width of the MLP's hidden layer"),
        ("data_path", str, "", "an .npz of x_train, y_train, x_test, y_test, or a folder of "
         "TFRecord files (tools/npz_to_tfrecord.py) (default: the digits)"),
        ("log_dir", str, "", "checkpoints and summaries; one that has them resumes"),
        ("seed", non_negative_int, 0, "seed of the initial weights and the shuffling"),
        ("log_every", positive_int, 100, "a progress line (the chief's: with the test metrics) "
         "every N local steps"),
    ]
    cluster = [
        ("job_name", str, "", "ps or worker (or set TF_CONFIG)"),
        ("task_index", non_negative_int, 0, "this task's index in its job"),
        ("ps_hosts", str, "", "comma-separated host:port of the ps tasks"),
        ("worker_hosts", str, "", "comma-separated host:port of the workers"),
        ("connect_timeout", positive_float, None, "seconds to wait for the other tasks; if not "
         "given, 60, or 600 under TF_CONFIG (a cluster's pods may start minutes apart)"),
        ("watchdog", positive_float, 300.0, "a worker whose step has not returned for this many "
         "seconds exits, for its restart policy to start it again (the examples with a ps)"),
    ]
    for flag, kind, default, text in common + (cluster if JOBS else []):
        p.add_argument("--" + flag, type=kind, default=default, help=text)
    example_flags(p)
    args = p.parse_args(argv)
    if not args.log_dir:  # a new folder for every run, beside this file
        run_name = time.strftime("%Y%m%d-%H%M%S-") + str(os.getpid())
        args.log_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "logs", run_name)
    return args
# <<< shared: flags


# >>> shared: data files
Records = collections.namedtuple("Records", "train_files test_files shape dtype scale num_classes")


def read_records(path):
    """--data_path's TFRecord files, checked before TensorFlow loads: a folder, or a glob of its
    training files, as tools/npz_to_tfrecord.py writes them: train-*.tfrecord and
    test-*.tfrecord, each record a tf.train.Example with the features x (the example's array,
    its raw bytes) and y (its label: int64 for classes, float for a regression), and meta.json
    (x_shape, x_dtype, x_scale: x is divided by it; num_classes: null for a regression;
    train_examples and test_examples). The files of each part are all N of one write
    (PART-K-of-N), holding the examples meta.json counts: never a glob's test files, nor an
    older write's files left in the folder, trained on."""
    if os.path.isdir(path):
        folder, train_files = path, sorted(glob.glob(os.path.join(path, "train-*.tfrecord")))
    else:
        train_files = sorted(glob.glob(path))
        folder = os.path.dirname(train_files[0]) if train_files else os.path.dirname(path)
    tested = [f for f in train_files if os.path.basename(f).startswith("test-")]
    if tested:  # a glob as broad as DIR/*.tfrecord
        fail("%s takes test files (%s) as training files: give the folder, or a glob of its "
             "train-*.tfrecord" % (path, os.path.basename(tested[0])))
    if not train_files:
        fail("%s: no training files (train-*.tfrecord): give an .npz, or a folder of TFRecord "
             "files that tools/npz_to_tfrecord.py wrote" % path)
    test_files = sorted(glob.glob(os.path.join(folder, "test-*.tfrecord")))
    if not test_files:
        fail("%s: no test files (test-*.tfrecord) beside the training files" % folder)
    check_shards(folder, train_files, "train")  # one write's, whole: not two writes' mixed
    check_shards(folder, test_files, "test")
    try:
        with open(os.path.join(folder, "meta.json")) as f:
            meta = json.load(f)
        shape, dtype = tuple(int(n) for n in meta["x_shape"]), np.dtype(meta["x_dtype"])
        scale, num_classes = float(meta["x_scale"]), meta["num_classes"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail("%s: no readable meta.json (%s: %s) beside the TFRecord files: write them with "
             "python tools/npz_to_tfrecord.py DATA.npz FOLDER" % (folder, type(e).__name__, e))
    counts = {part: sum(count_records(name) for name in files)
              for part, files in (("train", train_files), ("test", test_files))}
    for part in ("train", "test"):
        if meta.get(part + "_examples", counts[part]) != counts[part]:
            fail("%s: its %s files hold %d examples, meta.json says %d: files of another "
                 "write? Write the folder again, into an empty one (tools/npz_to_tfrecord.py)"
                 % (folder, part, counts[part], meta[part + "_examples"]))
    return Records(train_files, test_files, shape, dtype, scale, num_classes)


def check_shards(folder, files, part):
    """files are one write's PART-K-of-N.tfrecord, all N of them: not two writes' mixed."""
    totals = sorted({os.path.basename(f).rsplit("-of-", 1)[-1].split(".")[0] for f in files})
    if len(totals) != 1 or not totals[0].isdigit() or int(totals[0]) != len(files):
        fail("%s: its %s files are not the %s of one write (%d file(s), %s): write the folder "
             "again, into an empty one (tools/npz_to_tfrecord.py)" % (
                 folder, part, "N files -of-N" if len(totals) == 1 else "same -of-N",
                 len(files), " and ".join("-of-" + t for t in totals)))


def count_records(name):
    """The records in a TFRecord file, read from their headers alone (each: its length, 8
    bytes, and its checksum, 4; then the data and its checksum). Not one: a one-line error."""
    size, records, offset = os.path.getsize(name), 0, 0
    with open(name, "rb") as f:
        while offset < size:
            header = f.read(12)
            length = int.from_bytes(header[:8], "little") if len(header) == 12 else -1
            if not 0 < length <= size - offset - 16:
                fail("%s is not a TFRecord file (tools/npz_to_tfrecord.py writes them)" % name)
            offset += 16 + length
            f.seek(offset)
            records += 1
    return records


def records_dataset(data, batch_size, worker_index, num_workers, seed):
    """This worker's endless stream of mini-batches from its own TFRecord files (file k goes to
    worker k mod N): no worker reads, or holds, the whole set. Every epoch, its files in a new
    order, read a few at a time, interleaved; records shuffled in a buffer of 10,000, batched,
    then parsed and scaled a batch at a time, in parallel, ahead of the training step."""
    if len(data.train_files) < num_workers:
        fail("%d training file(s) for %d workers: each worker reads files of its own; write at "
             "least %d (tools/npz_to_tfrecord.py --shards N)"
             % (len(data.train_files), num_workers, num_workers))
    if isinstance(worker_index, int):
        mine = data.train_files[worker_index::num_workers]
        uneven = len(data.train_files) % num_workers
        print("[worker%d] reading %d of %d training files: %s%s" % (
            worker_index, len(mine), len(data.train_files), ",".join(
                os.path.basename(f) for f in mine), "" if not uneven else (
                " (uneven: %d files over %d workers, so the examples of a worker with fewer "
                "files come more often; write a multiple of %d shards)" % (
                    len(data.train_files), num_workers, num_workers))), flush=True)
    files = tf.data.Dataset.from_tensor_slices(data.train_files).shard(num_workers, worker_index)
    records = files.shuffle(len(data.train_files), seed=seed).interleave(
        tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE)
    records = records.shuffle(10000, seed=seed).repeat().batch(batch_size, drop_remainder=True)
    return records.map(parse_records(data), tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def parse_records(data):
    """The parser of a batch of the files' records (tf.train.Examples): x in float32, scaled
    to [0, 1], and y. Training and the chief's test set read the files through this one."""
    def parse(serialized):
        features = tf.io.parse_example(serialized, {
            "x": tf.io.FixedLenFeature([], tf.string),
            "y": tf.io.FixedLenFeature([], tf.int64 if data.num_classes else tf.float32)})
        x = tf.reshape(tf.io.decode_raw(features["x"], data.dtype), (-1,) + data.shape)
        return tf.cast(x, tf.float32) / data.scale, features["y"]
    return parse


ARRAYS_IN_A_GRAPH_MB = 256  # ParameterServerStrategy's traced dataset function: larger arrays
# are refused (each worker would hold the graph's copy, and a GraphDef holds 2 GB at most)


def arrays_dataset(x, y, worker_index, num_workers, seed):
    """This worker's shard of the arrays (x, y), example by example, in a new order every epoch,
    integer pixels (Pixels) a byte each until they leave the shuffle. Never a constant of a
    tf.compat.v1 graph (its GraphDef would hold the arrays: 2 GB at most, and copies in memory):
    the graph asks Python for the shard when the pipeline starts. In TensorFlow 2 the arrays
    themselves; ParameterServerStrategy traces its dataset function, which makes them a constant
    of a graph that every worker holds, so arrays over ARRAYS_IN_A_GRAPH_MB are refused there."""
    pixels, scale = (x.pixels, x.scale) if isinstance(x, Pixels) else (np.asarray(x), None)
    if tf.compat.v1.executing_eagerly_outside_functions():
        size = (pixels.nbytes + np.asarray(y).nbytes) / 2**20
        if not tf.executing_eagerly() and size > ARRAYS_IN_A_GRAPH_MB:  # traced: a constant
            fail("%.0f MB of training arrays would be a constant of the traced dataset function, "
                 "on every worker (at most %d MB): write them as TFRecord files (python "
                 "tools/npz_to_tfrecord.py DATA.npz FOLDER) and give --data_path FOLDER"
                 % (size, ARRAYS_IN_A_GRAPH_MB))
        examples = tf.data.Dataset.from_tensor_slices((pixels, y)).shard(num_workers,
                                                                         worker_index)
    else:
        shard = lambda: (pixels[worker_index::num_workers], y[worker_index::num_workers])
        arrays = tf.data.Dataset.range(1).map(lambda _: tuple(tf.compat.v1.py_func(
            shard, [], [tf.as_dtype(pixels.dtype), tf.as_dtype(y.dtype)], stateful=False)))
        examples = arrays.map(lambda xs, ys: (tf.ensure_shape(xs, (None,) + x.shape[1:]),
                                              tf.ensure_shape(ys, (None,) + y.shape[1:]))).unbatch()
    examples = examples.shuffle(len(x) // num_workers + 1, seed=seed)  # the shards differ
    if scale is None:
        return examples
    return examples.map(lambda xs, ys: (tf.cast(xs, tf.float32) / scale, ys))


def example_shape(data):
    """The shape of one example: the arrays' rows, or the TFRecord files' x_shape."""
    return data.shape if isinstance(data, Records) else data.x_train.shape[1:]


def test_batches(test_set, size=1000):
    """The test set, size examples at a time: the data (its x_test and y_test), the arrays
    (x, y), or TFRecord files (Records: read as they stream, never all in memory)."""
    if not isinstance(test_set, Records):
        x, y = (test_set.x_test, test_set.y_test) if hasattr(test_set, "x_test") else test_set
        return ((x[i:i + size], y[i:i + size]) for i in range(0, len(x), size))
    return record_batches(test_set, size)


def record_batches(data, size):
    """The test files' examples, size at a time, as they stream from the files: a
    TFRecordDataset parsed as training parses them (parse_records), in a graph of its own."""
    graph = tf.Graph()
    with graph.as_default():  # left before the first yield: the caller's graph stays its own
        batches = tf.data.TFRecordDataset(data.test_files).batch(size).map(parse_records(data))
        next_batch = tf.compat.v1.data.make_one_shot_iterator(batches).get_next()
    session = tf.compat.v1.Session(graph=graph)  # not as a "with": that makes it the default
    try:
        while True:
            try:
                x, y = session.run(next_batch)
            except tf.errors.OutOfRangeError:
                return
            yield x, y
    finally:
        session.close()


DATA_STARTS = ("data_starts", "data_start_steps")  # session_stream's: graph collections


def session_stream(dataset, seed, worker_index):
    """The next element of dataset(session_seed), as tensors of the graph. Every session starts
    the stream anew (start_the_data), its seed drawn from seed, this worker and the global step
    at the session's start: no two workers share an order, and after a restart or a resume a
    worker does not replay the mini-batches it began with."""
    start_step = tf.compat.v1.placeholder_with_default(np.int64(0), [], name="data_start_step")
    iterator = tf.compat.v1.data.make_initializable_iterator(
        dataset((seed * 1000 + worker_index) * 1000003 + start_step))
    tf.compat.v1.add_to_collection(DATA_STARTS[0], iterator.initializer)
    tf.compat.v1.add_to_collection(DATA_STARTS[1], start_step)
    return iterator.get_next()


def start_the_data(session, global_step):
    """Start every training stream of the graph (session_stream) in a new session, at
    global_step."""
    starts, steps = (tf.compat.v1.get_collection(name) for name in DATA_STARTS)
    session.run(starts, {step: global_step for step in steps})
# <<< shared: data files


# >>> shared: keras
KERAS_MODELS = {}  # by names: the Keras model, the parameters keras_params made of it, and the
# graph's name scope then (the start of its weights' names)


def keras_params(model):
    """A built Keras model's weights as an example's parameters: {name: variable}, in the order
    the model made them (Keras 3's variables hold TensorFlow ones: those, which the examples'
    loops differentiate and update). Remembered, so that keras_logits finds the model again.
    The examples run every layer as at test and train every weight by its gradient, so a model
    that acts otherwise in training is refused in one line: a layer that drops or adds noise at
    random (Dropout, GaussianNoise, a Random* augmentation), weights not trained by gradients
    (BatchNormalization's moving statistics, a frozen layer), or losses of the model's own (a
    regulariser) that model_loss does not add."""
    def refused():
        for layer in model._flatten_layers(include_self=False):
            kind = "layer %s (%s)" % (layer.name, type(layer).__name__)
            if type(layer).__name__.startswith("Random") or any(
                    getattr(layer, rate, 0) for rate in ("rate", "dropout", "recurrent_dropout",
                                                         "stddev")):
                return kind + " acts at random in training"
            if layer.non_trainable_weights and not list(layer._flatten_layers(include_self=False)):
                return kind + " has weights not trained by gradients"
        if model.losses:
            return "regulariser (model.losses) adds to the loss"
    reason = refused()
    if reason:
        fail("the Keras model's %s: the examples run every layer as at test, train every weight "
             "by its gradient and minimise model_loss alone; take it out, or write that part with "
             "raw variables (docs/own-model.md)" % reason)
    params = {}
    for w in model.weights:
        name = getattr(w, "path", None) or w.name.split(":")[0]
        params[name] = w if isinstance(w, tf.Variable) else w.value
    scope = tf.compat.v1.get_default_graph().get_name_scope()
    KERAS_MODELS[tuple(params)] = (model, params, scope + "/" if scope else "")
    return params


def keras_logits(params, x):
    """The logits, for the examples x, of the Keras model behind params, computed with params'
    values: the model itself over its own weights; over any other dict of the same names (a
    worker's local copy, the parameters plus noise), the model built again (tf_keras's
    clone_model, in the tf.compat.v1 examples) with each weight taken from params by its name
    (and checked for its shape): the copy's names are the model's, built in a scope of its own."""
    model, own, scope = KERAS_MODELS[tuple(params)]
    if params is own:
        return model(x)
    import tf_keras
    taken = {}  # no weight of the dict twice

    def weight_by_name(next_creator, **kwargs):
        graph_scope = tf.compat.v1.get_default_graph().get_name_scope()
        name = graph_scope[len(copy_scope):] + "/" + kwargs["name"]  # as the model names it
        found = [n for n in params if n == scope + name] or [
            n for n in params if n == name or n.endswith("/" + name)]
        if len(found) != 1 or found[0] in taken:
            raise ValueError("keras_logits: the copy's weight %s matches %s of the model's "
                             "weights %s" % (name, found or "none", list(params)))
        shape = tf.TensorShape(kwargs.get("shape"))
        if not shape.is_compatible_with(params[found[0]].shape):
            raise ValueError("keras_logits: the copy's weight %s has the shape %s, the dict's %s"
                             % (name, shape, params[found[0]].shape))
        taken[found[0]] = True
        return params[found[0]]
    with tf.compat.v1.name_scope("keras_copy") as copy_scope:  # a fresh scope: no name taken
        with tf.variable_creator_scope(weight_by_name):
            return tf_keras.models.clone_model(model)(x)  # (a model built at its first call)
# <<< shared: keras


# >>> shared: tasks
def check_cluster(cluster, job, index):
    """Every address is host:port, the job is one of the cluster's, the index is in range."""
    for name, hosts in cluster.items():
        for address in hosts:
            host, _, port = str(address).rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                fail("%s hosts: %r is not host:port (for example localhost:2222)"
                     % (name, address))
    if job not in cluster:
        fail("unknown job name %r: use %s" % (job, " or ".join(cluster)))
    if not 0 <= index < len(cluster[job]):
        fail("task index %d is out of range: the %s job has %d task(s), 0..%d"
             % (index, job, len(cluster[job]), len(cluster[job]) - 1))


def cause(error):
    """The line of a TensorFlow error that says what went wrong (not where, nor the trace)."""
    lines = [line for line in error.message.splitlines()  # not a rule of ====, nor indented
             if any(c.isalpha() for c in line) and not line.startswith((" ", "\t", "Node: "))]
    return lines[-1] if lines else type(error).__name__


def is_listening(address):
    try:
        socket.create_connection(address.rsplit(":", 1), timeout=1).close()
    except OSError:
        return False
    return True


def wait_for(condition, seconds=float("inf"), waiting=None):
    """Whether condition() came true within seconds; waiting() says every 30 s what for."""
    started = last_line = time.time()
    while not condition():
        if time.time() > started + seconds:
            return False
        if waiting and time.time() > last_line + 30:
            print("%s (%.0f s so far)" % (waiting(), time.time() - started), flush=True)
            last_line = time.time()
        time.sleep(0.25)  # the pace of the checks
    return True
# <<< shared: tasks


# >>> shared: summary
def print_summary(role, summary):
    """The run's last line, key=value ...: what users, the tests and the benchmarks read."""
    text = lambda v: (",".join(map(str, v)) if isinstance(v, list)
                      else "%.6g" % v if isinstance(v, float) else str(v))
    print("[%s] summary %s" % (role, " ".join("%s=%s" % (k, text(v)) for k, v in summary.items())),
          flush=True)
# <<< shared: summary


# >>> shared: test metrics
def test_metrics_in_batches(session, metrics, x, y, test_set):
    """Each of metrics (tensors, each a mean over a batch) averaged over the whole test set, fed
    1000 examples at a time into the placeholders x and y (test_batches): a large test set never
    becomes a graph constant, nor needs to fit in memory."""
    totals, examples = dict.fromkeys(metrics, 0.0), 0
    for x_test, y_test in test_batches(test_set):
        feed = {x: x_test, y: y_test}
        for name, value in session.run(metrics, feed).items():
            totals[name] += value * len(feed[x])
        examples += len(feed[x])
    return {name: float(total / examples) for name, total in totals.items()}


def tensorboard_summary(metrics, loss=None):
    """The test metrics (test_NAME), and the training loss if given, as one TensorBoard
    summary."""
    summary = tf.compat.v1.Summary()
    for name, value in metrics.items():
        summary.value.add(tag="test_" + name, simple_value=value)
    if loss is not None:
        summary.value.add(tag="loss", simple_value=loss)
    return summary
# <<< shared: test metrics


# >>> shared: one client
def resolve_workers(args):
    """The workers from the flags, or else from TF_CONFIG (a "worker" job, a "chief" as worker 0,
    and no ps); None when neither is given: this process runs alone. Sets job_name, task_index,
    role, and connect_timeout if not given: 60 s, or 600 s under TF_CONFIG."""
    job, index = args.job_name or "worker", args.task_index
    if args.ps_hosts:
        fail("this example has no parameter server: give --worker_hosts only")
    from_flags = bool(args.worker_hosts or args.job_name)
    if from_flags:
        if not args.worker_hosts:
            fail("give --worker_hosts (or set TF_CONFIG, or neither to run alone)")
        cluster = {"worker": args.worker_hosts.replace(" ", "").split(",")}
    elif "TF_CONFIG" in os.environ:
        try:
            config = json.loads(os.environ["TF_CONFIG"])
            spec, job = config["cluster"], config["task"]["type"]
            index = int(config["task"].get("index") or 0)
            chief = list(spec.get("chief", [])) + list(spec.get("master", []))
            cluster = {"worker": chief + list(spec.get("worker", []))}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            fail("TF_CONFIG is not valid cluster JSON with a worker job (%s: %s)"
                 % (type(e).__name__, e))
        if spec.get("ps"):
            fail("this example has no parameter server: TF_CONFIG names a ps job")
        if job in ("chief", "master"):  # a chief is the client: worker 0
            job, index = "worker", 0
        elif job == "worker":
            index += len(chief)  # the workers come after the chief
    else:
        args.job_name, args.role = "", "local"
        return None
    if args.connect_timeout is None:  # a cluster's pods may start minutes apart
        args.connect_timeout = 60.0 if from_flags else 600.0
    check_cluster(cluster, job, index)
    args.job_name, args.task_index, args.role = job, index, "worker%d" % index
    return cluster


def task_config(args):
    """A session's and a server's devices: --devices CPU devices (logical ones share the cores),
    and one thread per op, to leave cores to the other tasks on the same machine."""
    return tf.compat.v1.ConfigProto(device_count={"CPU": args.devices},
                                    intra_op_parallelism_threads=1)


def run_task(args, cluster, train, data):
    """Load TensorFlow; alone, train in this process; in a cluster, start this task's server,
    then worker 0 trains (it is the client: train(args, cluster, target, data)) and the others
    serve."""
    global tf  # loaded only now: bad input has failed in one line, without TensorFlow's start-up
    if cluster and port_taken(cluster["worker"][args.task_index]):
        fail("%s: port %s is already in use: by an earlier run, or another program?"
             % (args.role, cluster["worker"][args.task_index]))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before the import: no C++ info lines
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    try:
        if not cluster:
            return train(args, None, "", data)
        server = tf.compat.v1.train.Server(cluster, job_name="worker",
                                           task_index=args.task_index, config=task_config(args))
        if args.task_index > 0:
            return serve(args, cluster, server)
        return train(args, cluster, server.target, data)
    except tf.errors.OpError as e:
        lost = isinstance(e, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError))
        why = "a worker is gone or did not answer within --step_timeout" if lost else cause(e)
        print("error: %s stopped: %s: %s" % (args.role, type(e).__name__, why),
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(2)  # the session's threads, stuck on the lost worker, would keep exit() waiting


def run_over_flag(index):
    """A flag on worker index that the client raises when the run is over. The variable has the
    same name in the client's graph and in the worker's, so the worker reads what the client
    writes, on its own device: ending needs no other task."""
    with tf.compat.v1.device("/job:worker/task:%d" % index):
        return tf.compat.v1.Variable(False, collections=[], name="run_over_%d" % index)


def serve(args, cluster, server):
    """A worker other than the client runs what the client's graph places on it until the
    client says the run is over; TensorFlow's server never ends by itself. A client that is
    lost or restarts does not end it (a restarted client resumes with the same workers). A
    worker whose flag no client has set up within --connect_timeout served no one: an error."""
    index = args.task_index
    with tf.Graph().as_default():
        run_over = run_over_flag(index)
        set_up = tf.compat.v1.is_variable_initialized(run_over)
        session = tf.compat.v1.Session(server.target, config=tf.compat.v1.ConfigProto(
            device_filters=["/job:worker/task:%d" % index]))  # itself: nobody else to wait for
    print("[%s] serving %d device(s) at %s for the client, worker 0" % (
        args.role, args.devices, cluster["worker"][index]), flush=True)
    if not wait_for(lambda: session.run(set_up), args.connect_timeout, waiting=lambda: (
            "[%s] waiting for the client (worker0) at %s" % (args.role, cluster["worker"][0]))):
        fail("%s: no client came within %g s: this worker served no one"
             % (args.role, args.connect_timeout))
    wait_for(lambda: session.run(run_over))
    print("[%s] the run is over; shutting down" % args.role, flush=True)
    return 0


def run_devices(args, cluster):
    """The devices that carry the model, in order: --devices of each worker task (or of this
    process alone), its GPUs if this machine has that many, else CPUs (task_config makes
    them); and the controller, the client's CPU, where the shared variables and the input go."""
    kind = "GPU" if len(tf.config.list_physical_devices("GPU")) >= args.devices else "CPU"
    tasks = ["/job:worker/task:%d" % i for i in range(len(cluster["worker"]))] if cluster else [""]
    devices = ["%s/device:%s:%d" % (task, kind, d) for task in tasks for d in range(args.devices)]
    return devices, tasks[0] + "/device:CPU:0"


class Client(object):
    """The client's session, progress lines, checkpoints, test metrics, TensorBoard summaries
    and summary line, given what train() built: test_metrics(x, y), a dict of metric tensors for
    a batch of test examples (each a mean over the batch), and test_set (the data, or arrays
    (x, y): test_batches), fed to it in batches. Made under a device scope, the metrics run
    there."""

    def __init__(self, args, cluster, test_metrics, test_set):
        self.args, self.cluster, self.test_set = args, cluster, test_set
        self.global_step = tf.compat.v1.train.get_or_create_global_step()
        x_test, y_test = next(test_batches(test_set, 1))  # an example: the placeholders' types
        self.test_x = tf.compat.v1.placeholder(x_test.dtype, (None,) + x_test.shape[1:])
        self.test_y = tf.compat.v1.placeholder(y_test.dtype, (None,) + y_test.shape[1:])
        self.test_metrics = test_metrics(self.test_x, self.test_y)
        self.step, self.history = 0, []
        others = range(1, len(cluster["worker"])) if cluster else []
        self.run_over = [run_over_flag(k) for k in others]  # every other worker's own flag
        self.raise_run_over = [flag.assign(True) for flag in self.run_over]

    def start(self, target, devices):
        """The session, once every worker answers; the variables restored from --log_dir or
        initialised."""
        args, role = self.args, self.args.role
        self.saver = tf.compat.v1.train.Saver()  # the variables, wherever they live
        init = tf.compat.v1.global_variables_initializer()
        tf.compat.v1.get_default_graph().finalize()  # a loop that adds ops would grow forever
        workers = self.cluster["worker"] if self.cluster else []
        silent = lambda: [w for w in workers if not is_listening(w)]
        if not wait_for(lambda: not silent(), args.connect_timeout, waiting=lambda: (
                "[%s] waiting for the worker(s) at %s" % (role, ",".join(silent())))):
            fail("%s: cannot reach the worker(s) at %s: are they running?"
                 % (role, ",".join(silent())))
        config = task_config(args)
        config.operation_timeout_in_ms = int(args.step_timeout * 1000)  # a lost worker: an error
        session = tf.compat.v1.Session(target, config=config)
        print("[%s] client: log_dir=%s" % (role, args.log_dir), flush=True)
        print("[%s] the model on %d device(s): %s" % (role, len(devices), " ".join(devices)),
              flush=True)
        self.writer = tf.compat.v1.summary.FileWriter(args.log_dir, session.graph)
        session.run([flag.initializer for flag in self.run_over])  # the run is not over
        checkpoint = tf.train.latest_checkpoint(args.log_dir)
        if checkpoint:
            self.saver.restore(session, checkpoint)
            print("[%s] resuming from the checkpoint at global step %d"
                  % (role, session.run(self.global_step)), flush=True)
        else:
            session.run(init)
        self.step = self.start_step = int(session.run(self.global_step))
        start_the_data(session, self.step)  # a resumed run draws a new order, no replay
        self.last_checkpoint = 0.0  # the first progress line saves one
        self.start_clock()  # again at the first update
        print("[%s] training started" % role, flush=True)
        return session

    def start_clock(self):
        """The run's clock (its rates, its history's seconds) starts once the first update has
        returned, in every example: set-up, and the first step's own preparation, untimed."""
        self.started = self.progress_time = time.time()
        self.timed_from_step = self.progress_step = self.step

    def after_update(self, session, loss, global_step):
        """Count the update; every --log_every steps a progress line with the test metrics and,
        once every 30 s, a checkpoint."""
        first = self.step == self.start_step
        self.step = int(global_step)
        if first:  # the clock starts as the first update returns (start_clock)
            self.start_clock()
        if self.step % self.args.log_every:
            return
        rate = (self.step - self.progress_step) / (time.time() - self.progress_time)
        line = "[%s] global_step=%d loss=%.4f" % (self.args.role, self.step, loss)
        for name, value in self.evaluate(session, self.step, loss).items():
            line += " test_%s=%.4f" % (name, value)
        print(line + " steps_per_sec=%.1f" % rate, flush=True)
        if time.time() > self.last_checkpoint + 30:
            self.save(session)
        self.progress_step, self.progress_time = self.step, time.time()

    def save(self, session):
        """A checkpoint of every variable, in --log_dir (the last 5 are kept)."""
        self.saver.save(session, os.path.join(self.args.log_dir, "model.ckpt"), self.step)
        self.last_checkpoint = time.time()

    def evaluate(self, session, global_step, loss=None):
        """The test metrics, each a mean over the test set, fed 1000 examples at a time (a large
        test set is never a graph constant); also to TensorBoard, with the loss if given."""
        metrics = test_metrics_in_batches(session, self.test_metrics, self.test_x, self.test_y,
                                          self.test_set)
        self.writer.add_summary(tensorboard_summary(metrics, loss), global_step)
        seconds = round(time.time() - self.started, 3)
        self.history.append([seconds, global_step] + list(metrics.values()))
        return metrics

    def end(self, session, **extra):
        """The last checkpoint and evaluation, and the summary line with the example's extra
        fields; then the client tells the other workers that the run is over."""
        self.step = int(session.run(self.global_step))
        self.save(session)
        updates, seconds = self.step - self.start_step, time.time() - self.started
        rate = (self.step - self.timed_from_step) / seconds
        workers = len(self.cluster["worker"]) if self.cluster else 1
        summary = dict(example=EXAMPLE)
        for name, value in self.evaluate(session, self.step).items():  # what it saved
            summary["test_" + name] = value
        summary.update(global_step=self.step, workers=workers, ps=0, lost_workers=0,
                       local_steps=[updates], updates=updates, timed_from_step=self.timed_from_step,
                       timed_seconds=seconds, steps_per_sec=rate,
                       examples_per_sec=rate * self.args.batch_size, **extra)
        print_summary(self.args.role, summary, self.history, self.args.metrics_file)
        self.writer.close()
        session.run(self.raise_run_over)
        session.close()
        return 0
# <<< shared: one client


if __name__ == "__main__":
    sys.exit(main())

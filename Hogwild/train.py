"""Hogwild: asynchronous SGD, every worker writing to the shared parameters without a lock.

What it teaches
    The plainest data-parallel algorithm on a parameter server, and the one the others in this
    guide refine. The model's variables exist once, on the ps. Each worker, at its own pace and
    without waiting for anyone, reads them, computes a gradient on its own mini-batch and
    subtracts it from them in place. Another worker's update may land between a worker's read
    and its write, so some gradients are computed on parameters that are already a few updates
    old ("stale"); Hogwild! showed that SGD converges anyway. The global step counts the steps
    of all workers together, so with n workers it grows about n times as fast as each worker's.

The update rule (each step of worker k; no lock, no barrier)
    pull:  params <- global_params                              # read from the ps
           g      <- grad L(params; next mini-batch of worker k)
    push:  global_params <- global_params - learning_rate * g   # on the ps, to whatever it is now
           global_step   <- global_step + 1

Run it
    bash run.sh                          # 1 ps + 2 workers on free localhost ports
    NUM_WORKERS=4 bash run.sh --steps 4000
    By hand or with TF_CONFIG: as in ../Distributed-Setup.

Use your own model: replace the sections marked "(replace with your own)", Data and Model.

References
    F. Niu, B. Recht, C. Re, S. J. Wright, "Hogwild!: A Lock-Free Approach to Parallelizing
    Stochastic Gradient Descent", NIPS 2011 (shared memory; here the shared memory is the ps).
    J. Dean et al., "Large Scale Distributed Deep Networks", NIPS 2012 (asynchronous SGD on a
    parameter server).
"""
import argparse
import collections
import contextlib
import glob
import json
import os
import socket
import sys
import threading
import time

import numpy as np

tf = None  # loaded once the flags are checked: bad input fails in one line, at once
EXAMPLE = "Hogwild"
JOBS = ("ps", "worker")  # the jobs of its cluster; deploy/ and the tests read them here


def example_flags(parser):
    """Hogwild has only the flags every example shares (see parse_flags)."""


# --- Data (replace with your own) -----------------------------------------------------------------
# >>> shared: data
Dataset = collections.namedtuple("Dataset", "x_train y_train x_test y_test num_classes x_scale",
                                 defaults=[1.0])  # x_scale: integer pixels are divided by it


def load_dataset(data_path=""):
    """By default scikit-learn's 1797 handwritten 8x8 digits (offline; a fixed fifth to test),
    rows of 64 pixels in [0, 1], labels 0-9; or data_path's, checked below the banner."""
    if data_path.endswith(".npz"):  # arrays (read_npz)
        return Dataset(*read_npz(data_path))
    if data_path:  # a folder of TFRecord files (read_records)
        return read_records(data_path)
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
Hogwild = collections.namedtuple("Hogwild", "global_params global_step pulled_at loss step")


def build_hogwild(args, cluster, x, y, num_classes=10):
    """One Hogwild step of this worker on the mini-batch (x, y): pull, gradient, push; its value
    is the global step it made. replica_device_setter puts every variable on the ps and every
    other op on this worker: the parameters exist once, the gradient is computed here."""
    # placement: every variable made in this scope goes to a ps task (in turn), every other op
    # to this worker
    on_the_ps = tf.compat.v1.train.replica_device_setter(
        cluster=cluster, worker_device="/job:worker/task:%d" % args.task_index)
    with tf.compat.v1.device(on_the_ps):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        global_params = model_params(x.shape[1:], args.hidden, args.seed, num_classes)
        # pull: read global_params from the ps as they are at this moment; the clock is read
        # first, so every push it counts has landed in what is read (for the staleness meter)
        pulled_at = global_step.read_value()
        with tf.control_dependencies([pulled_at]):
            pulled = {name: theta.read_value() for name, theta in global_params.items()}
        loss = model_loss(pulled, x, y)
        gradients = tf.gradients(loss, list(pulled.values()))
        # push: the subtraction runs on the ps, on whatever the parameters have become since the
        # pull. use_locking=False (the default, spelled out) lets the updates of two workers to
        # one variable interleave instead of queueing for a lock: Hogwild's bet.
        sgd = tf.compat.v1.train.GradientDescentOptimizer(args.learning_rate, use_locking=False)
        push = sgd.apply_gradients(zip(gradients, global_params.values()))
        with tf.control_dependencies([push]):  # the clock counts a push once it has landed
            step = tick(global_step)
    return Hogwild(global_params, global_step, pulled_at, loss, step)


# >>> shared: staleness
def tick(global_step):
    """global_step + 1, its value the clock this update made: the add and that read run in one
    critical section on the ps (assign_add's own value is a later read, maybe after another
    worker's add). Only the clock is locked, not the updates."""
    with tf.compat.v1.device(global_step.device):
        clock_lock = tf.CriticalSection(name="clock_lock", shared_name="clock_lock")

    def add_one():
        before = global_step.read_value()
        with tf.control_dependencies([before]):
            added = global_step.assign_add(1, read_value=False)
        with tf.control_dependencies([added]):
            return tf.identity(before + 1)
    return clock_lock.execute(add_one, exclusive_resource_access=False)


def count_staleness(worker, update, pulled_at=None):
    """update (its value: the clock its tick made), also adding up on the ps how many updates of
    others ticked since this worker pulled: since the clock pulled_at (read in the same step just
    before the parameters: every update ticked by then is in what the worker read), or else since
    this worker's previous update. It costs no traffic. Returns the update and the mean."""
    with tf.compat.v1.device("/job:worker/task:%d" % worker.args.task_index):
        last_update = tf.compat.v1.Variable(worker.global_step.read_value(), trainable=False,
                                            collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])
    with tf.compat.v1.device(worker.global_step.device):
        staleness_sum = tf.compat.v1.Variable(np.int64(0), trainable=False, name="staleness")
        counted = staleness_sum.assign_add(update - 1 - (
            last_update if pulled_at is None else pulled_at))
        mean = staleness_sum / tf.maximum(worker.global_step, 1)  # int64 / int64: a float64
    with tf.compat.v1.control_dependencies([counted]):
        return last_update.assign(update), mean
# <<< shared: staleness


# --- The training loop ----------------------------------------------------------------------------
def train(args, cluster, server, data):
    x, y = training_batches(data, args.batch_size, args.task_index, len(cluster["worker"]),
                            args.seed)  # no device given: the pipeline runs on this worker
    hogwild = build_hogwild(args, cluster, x, y, data.num_classes)
    worker = Worker(args, cluster, lambda x, y: model_metrics(hogwild.global_params, x, y),
                    data)
    step, mean_staleness = count_staleness(worker, hogwild.step, hogwild.pulled_at)
    # no barrier: each worker stops once it sees the global step reach --steps
    with worker.session(server, hogwild.loss, step, last_step=args.steps,
                        mean_staleness=mean_staleness) as session:
        while not session.should_stop():
            session.run(step)
    return 0


def main(argv=None):
    global tf
    args = parse_flags(argv, example_flags)  # bad input fails here, before TensorFlow loads
    cluster = resolve_cluster(args)  # {"ps": [host:port, ...], "worker": [...]}, or TF_CONFIG's
    data = load_dataset(args.data_path) if args.job_name == "worker" else None  # a ps needs none
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before the import: no C++ info lines
    import tensorflow as tf  # only now: bad input has failed in one line, before its start-up
    tf.compat.v1.disable_eager_execution()  # graphs and sessions: the tf.compat.v1 runtime
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)  # no deprecation notes
    # the cluster, every task's address by job, and this task's server in it (gRPC): the ps
    # tasks' servers hold the variables, the workers' run the steps (one thread: on one machine
    # the tasks share its cores)
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), args.job_name, args.task_index,
                                  config=tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1))
    with errors_in_one_line(args):  # a lost peer, a timeout: one line that says so
        if args.job_name == "ps":
            return serve(args, cluster, server)  # a ps only serves, until the chief ends the run
        return train(args, cluster, server, data)


# ==================================================================================================
# Plumbing shared by every example (what a job needs besides its algorithm)
# ==================================================================================================
# train() hands this part what it built: the step's tensors, the test metrics and the test set;
# nothing here knows the data, the model or the algorithm. The session is TensorFlow's
# MonitoredSession: a session creator on SessionManager, TensorFlow's hooks (StopAtStepHook,
# CheckpointSaverHook: the chief saves every 30 s and at the end) and hooks of this file's for
# what TensorFlow lacks. In this order; the same text in every train.py that runs on a ps (a
# test keeps the copies equal):
#   1. flags, each number of its type, and the cluster from them  parse_flags, number_type,
#      or from TF_CONFIG; --data_path's file, checked             resolve_cluster, check_cluster,
#                                                                  read_npz, Pixels, as_float32,
#                                                                  port_taken
#   2. each variable cut into a slice per ps, if asked            sharded_over_the_ps
#   3. a failure ends the task in one line                        errors_in_one_line, fail, cause
#   4. the session: a worker waits for the ps, then for the       Worker, reach_the_ps, wait_for,
#      chief, who restores the latest checkpoint or initialises   is_listening, StartOrRejoin,
#      where the ps lacks the variables; after a step lost to a   Hook, ExampleHook
#      restarted task, a new session, set up again
#   5. progress lines; the chief's test metrics over the test
#      set, in batches, to TensorBoard too                         Progress, test_metrics_in_batches,
#                                                                  tensorboard_summary
#   6. the end: the chief waits for the others, names any it
#      lost, prints the summary line and ends the run; a ps
#      serves until then (a TensorFlow server never ends itself)  RunStatus, print_summary, serve,
#                                                                  run_over_flag
#   7. a worker whose steps stop (--watchdog) exits, for its
#      restart policy to start it again                           Watchdog
#   8. the data's way in: TFRecord files, each worker reading      read_records, check_shards,
#      its own; arrays that are no constant of the graph; the     count_records, records_dataset,
#      test set in batches; each session's order of the           parse_records, arrays_dataset,
#      training stream; a Keras model's weights as the            example_shape, test_batches,
#      parameters                                                 record_batches, session_stream,
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
        ("log_every", positive_int, 100, "progress (the chief's: test metrics) every N local steps"),
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


# >>> shared: cluster and session
def resolve_cluster(args):
    """The cluster from the flags, or else from TF_CONFIG as operators write it: a "chief" or
    "master" becomes worker 0, an "evaluator" has nothing to do. Sets job_name and task_index,
    and connect_timeout if not given: 60 s, or 600 s under TF_CONFIG."""
    job, index = args.job_name, args.task_index
    from_flags = job or args.ps_hosts or args.worker_hosts or "TF_CONFIG" not in os.environ
    if args.connect_timeout is None:
        args.connect_timeout = 60.0 if from_flags else 600.0
    if from_flags:
        if not args.ps_hosts or not args.worker_hosts:
            fail("give --ps_hosts and --worker_hosts (or set TF_CONFIG)")
        cluster = {"ps": args.ps_hosts.replace(" ", "").split(","),
                   "worker": args.worker_hosts.replace(" ", "").split(",")}
    else:
        try:
            config = json.loads(os.environ["TF_CONFIG"])
            spec, job = config["cluster"], config["task"]["type"]
            index = int(config["task"].get("index") or 0)
            chief = list(spec.get("chief", [])) + list(spec.get("master", []))
            cluster = {"ps": list(spec["ps"]), "worker": chief + list(spec.get("worker", []))}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            fail("TF_CONFIG is not valid cluster JSON (%s: %s)" % (type(e).__name__, e))
        if job in ("chief", "master"):
            job, index = "worker", 0
        elif job == "worker":
            index += len(chief)  # the workers come after the chief
        elif job == "evaluator":
            print("[evaluator] nothing to do: the chief evaluates", flush=True)
            sys.exit(0)
    check_cluster(cluster, job, index)
    args.job_name, args.task_index = job, index
    if port_taken(cluster[job][index]):  # in one line here, rather than deep inside gRPC
        fail("%s %d: port %s is already in use: by an earlier run, or another program?"
             % (job, index, cluster[job][index]))
    return cluster


def sharded_over_the_ps(cluster, shard=True):
    """A variable scope in which each variable made is cut into one slice per ps task (along its
    first axis), so that every ps holds, and every ps link carries, an equal share of its bytes:
    replica_device_setter places whole variables, and one large matrix then loads one ps. Optimizers
    update the slices; the model reads each variable whole. shard=False: a scope that changes
    nothing."""
    partitioner = tf.compat.v1.fixed_size_partitioner(len(cluster["ps"])) if shard else None
    return tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), partitioner=partitioner)


@contextlib.contextmanager
def errors_in_one_line(args):
    """A TensorFlow error that ends this task (a peer lost, a wait timed out) as one line."""
    try:
        yield
    except tf.errors.OpError as e:
        fail("%s %d stopped: %s: %s" % (args.job_name, args.task_index, type(e).__name__,
                                        cause(e)))


def reach_the_ps(args, cluster):
    """Wait until every ps listens, at most --connect_timeout: a worker starts after it, and
    after it restarted."""
    silent = lambda: [ps for ps in cluster["ps"] if not is_listening(ps)]
    if not wait_for(lambda: not silent(), args.connect_timeout, waiting=lambda: (
            "[worker%d] waiting for the ps at %s" % (args.task_index, ",".join(silent())))):
        fail("cannot reach the ps at %s: is it running?" % ",".join(silent()))


def run_over_flag(ps_index):
    """A flag on each ps that the chief raises when the run is over: every worker has finished
    or is lost. A ps reads its own, so ending needs no other task."""
    with tf.compat.v1.device("/job:ps/task:%d" % ps_index):
        return tf.compat.v1.Variable(False, collections=[], name="run_over_%d" % ps_index)


def serve(args, cluster, server):
    """A ps serves until the chief says the run is over; TensorFlow's server never ends by
    itself. A ps whose flag no chief has set up within connect_timeout seconds, while the
    chief's port stays closed, served no one: it ends with an error (a chief that listens may be
    building a large graph: the ps waits on). The flag's variable has the same name in every
    task's graph, so the ps reads the one the chief writes."""
    index, connect_timeout = args.task_index, args.connect_timeout
    with tf.Graph().as_default():
        run_over = run_over_flag(index)
        set_up = tf.compat.v1.is_variable_initialized(run_over)
        session = tf.compat.v1.Session(server.target, config=tf.compat.v1.ConfigProto(
            device_filters=["/job:ps/task:%d" % index]))  # this ps alone: nothing else to wait for
    print("[ps%d] serving %d worker(s) at %s" % (index, len(cluster["worker"]),
                                                 cluster["ps"][index]), flush=True)
    chief = cluster["worker"][0]
    while not wait_for(lambda: session.run(set_up), connect_timeout, waiting=lambda: (
            "[ps%d] waiting for the chief (worker0) at %s" % (index, chief))):
        if not is_listening(chief):  # a chief that listens is alive, building its graph
            fail("ps%d: no chief at %s within %g s: this ps served no one" % (
                index, chief, connect_timeout))
    wait_for(lambda: session.run(run_over))
    print("[ps%d] the run is over; shutting down" % index, flush=True)
    return 0


class Worker(object):
    """A worker's part of the run besides its algorithm: test_metrics(x, y), the metric tensors
    of a batch of test examples, fed test_set (the data, or arrays (x, y)) in batches; the run's
    status on ps 0 (for each worker NOT_STARTED, TRAINING, or its local steps once finished;
    after ps 0 restarts the chief writes back what it last read); and session(). rejoins=False
    (Evolution-Strategies' chief): a restart, or a lost session, ends the task in one line."""
    NOT_STARTED, TRAINING = -2, -1
    GLOBAL_STEP_READ = "global_step_read_op_cache"  # tensorflow/python/training/training_util.py

    def __init__(self, args, cluster, test_metrics, test_set, steps_per_update=1, rejoins=True):
        self.args, self.cluster, self.test_set = args, cluster, test_set
        self.steps_per_update, self.rejoins = steps_per_update, rejoins
        self.role, self.is_chief = "worker%d" % args.task_index, args.task_index == 0
        self.global_step = tf.compat.v1.train.get_or_create_global_step()
        # TensorFlow's hooks (StopAtStepHook, CheckpointSaverHook) fetch the global step with
        # every run, through the tensor in the collection GLOBAL_STEP_READ (else their own, a
        # cond whose parts cross from the ps). Here Progress feeds it the global step the last
        # update returned, so that no run fetches it from the ps; a hook's own read, unfed
        # (when its stale value says the last step or a checkpoint is due), reads the ps.
        with tf.compat.v1.device(self.global_step.device):
            read = tf.identity(self.global_step, name="global_step_read")
        with tf.compat.v1.device("/job:worker/task:%d" % args.task_index):
            self.step_seen = tf.compat.v1.placeholder_with_default(read, [], "global_step_seen")
        tf.compat.v1.get_collection_ref(self.GLOBAL_STEP_READ)[:] = [self.step_seen]
        x_test, y_test = next(test_batches(test_set, 1))  # an example: the placeholders' types
        with tf.compat.v1.device("/job:worker/task:%d" % args.task_index):
            self.test_x = tf.compat.v1.placeholder(x_test.dtype, (None,) + x_test.shape[1:])
            self.test_y = tf.compat.v1.placeholder(y_test.dtype, (None,) + y_test.shape[1:])
            self.test_metrics = test_metrics(self.test_x, self.test_y)
        workers = len(cluster["worker"])
        with tf.compat.v1.device("/job:ps/task:0"):  # never checkpointed
            self.status = tf.compat.v1.Variable(np.full(workers, self.NOT_STARTED, np.int64),
                                                collections=[], name="run_status")
        self.my_status = tf.compat.v1.placeholder(tf.int64, [1])
        self.set_my_status = tf.compat.v1.scatter_update(self.status, [args.task_index],
                                                         self.my_status)
        self.run_over = [run_over_flag(k) for k in range(len(cluster["ps"]))]
        self.end_run = tf.group([flag.assign(True) for flag in self.run_over])
        if self.is_chief:  # a restarted chief, or a restarted ps, sets up only what is not there
            self.has_status = tf.compat.v1.is_variable_initialized(self.status)
            self.set_up = [(tf.compat.v1.is_variable_initialized(v), v.initializer)
                           for v in [self.status] + self.run_over]
            self.status_fed = tf.compat.v1.placeholder(tf.int64, [workers])
            self.write_back = self.status.assign(self.status_fed)
        self.status_seen = None  # the status as the chief last read it
        self.sessions, self.local_steps = 0, 0  # sessions made (StartOrRejoin), steps taken
        # the chief's last new session found the variables on the ps: it (or its session) was
        # restarted, the ps was not (a synchronous example's start-up reads it)
        self.kept_variables = False

    def session(self, server, loss, update, last_step=None, hooks=(), wait_for_everyone=False,
                minibatches_per_update=1, **summary):
        """TensorFlow's MonitoredSession, made by StartOrRejoin (wait_for_everyone: once every
        worker has started), with hooks: StopAtStepHook at last_step (None: the example stops
        itself), the example's own, Watchdog, RunStatus, the chief's CheckpointSaverHook (as a
        session starts, every 30 s, at the end) and Progress (update: a step's tensor, its value
        the global step after it; loss: the step's, or a placeholder the step feeds). After a
        step lost to a restart (Aborted, Unavailable) MonitoredSession makes a new session;
        closed, it runs the hooks' end: the chief waits for the others, saves, prints the
        summary line with the example's fields (values, tensors or functions) and ends the run."""
        creator = StartOrRejoin(self, server, wait_for_everyone)
        stop = [tf.compat.v1.train.StopAtStepHook(last_step=last_step)] if last_step else []
        hooks = stop + list(hooks) + [Watchdog(self.role, self.args.watchdog),
                                      RunStatus(self)]
        if self.is_chief:
            print("[worker0] chief: log_dir=%s" % self.args.log_dir, flush=True)
            hooks.append(tf.compat.v1.train.CheckpointSaverHook(
                self.args.log_dir, save_secs=30, saver=creator.saver))
        hooks.append(Progress(self, loss, update, minibatches_per_update, summary, last_step))
        return tf.compat.v1.train.MonitoredSession(session_creator=creator, hooks=hooks)

    def restore_or_initialise(self, session):
        """The chief's init_fn (StartOrRejoin): the run's status and the run-over flags set up
        where missing (the status it last read written back, after ps 0 restarted); then the
        latest checkpoint restored, or the variables initialised, only where the ps lacks them:
        a restarted chief goes on from the ps's global step, a restarted ps gets them back."""
        status_lost = not session.run(self.has_status)  # a new run, or ps 0 restarted
        for is_set_up, initializer in self.set_up:
            if not session.run(is_set_up):
                session.run(initializer)
        if status_lost and self.status_seen is not None:  # ps 0 restarted: the status back
            session.run(self.write_back, {self.status_fed: self.status_seen})
        self.kept_variables = len(session.run(self.not_ready)) == 0
        if not self.kept_variables:  # a new run, or the ps restarted
            checkpoint = tf.train.latest_checkpoint(self.args.log_dir)
            if checkpoint:
                self.saver.restore(session, checkpoint)
                print("[worker0] resuming from the checkpoint at global step %d"
                      % session.run(self.global_step), flush=True)
            else:
                session.run(self.initialise)
        elif self.sessions == 1:
            print("[worker0] resuming at global step %d: the ps kept the variables"
                  % session.run(self.global_step), flush=True)

    def read_status(self, session):
        """The run's status on ps 0; the chief keeps what it read, to write it back."""
        self.status_seen = session.run(self.status)
        return self.status_seen


class StartOrRejoin(object):
    """Worker.session's session creator (a SessionCreator's create_session) on SessionManager,
    as TensorFlow's ChiefSessionCreator and WorkerSessionCreator are, with two defaults
    corrected for tasks that leave and rejoin: the chief's prepare_session gets no
    checkpoint_dir (it would restore whenever a checkpoint exists, even over a ps that kept the
    run) but init_fn, restore_or_initialise; the others' wait_for_session checks every second
    (not every 30 s), at most --connect_timeout, then fails in one line. Each new session then
    starts the training stream (start_the_data) and marks the worker TRAINING. MonitoredSession
    calls it again after a lost step, with no pause nor limit: here a line says so, each try in
    a row comes a second later than the last, and the RETRIES-th ends the task in one line."""
    RETRIES = 6

    def __init__(self, worker, server, wait_for_everyone=False):
        self.worker, self.server, self.wait_for_everyone = worker, server, wait_for_everyone
        self.in_a_row, self.steps_then = 0, None  # new sessions with no step between them
        worker.saver = self.saver = tf.compat.v1.train.Saver()  # every global variable
        worker.initialise = tf.compat.v1.global_variables_initializer()
        worker.not_ready = tf.compat.v1.report_uninitialized_variables(
            tf.compat.v1.global_variables())
        worker.not_ready.mark_used()  # the chief's alone: no "never used" error elsewhere
        everything = (tf.compat.v1.global_variables() + tf.compat.v1.local_variables() +
                      [worker.status] + worker.run_over)  # the run's status too
        self.scaffold = tf.compat.v1.train.Scaffold(
            init_op=worker.initialise, saver=self.saver,
            ready_op=tf.compat.v1.report_uninitialized_variables(everything))

    def create_session(self):
        worker, args = self.worker, self.worker.args
        worker.sessions += 1
        if worker.sessions > 1:
            if not worker.rejoins:
                fail("%s: its session was lost to a restarted task, and %s cannot take up its "
                     "run again; start the whole run again" % (worker.role, EXAMPLE))
            same = worker.local_steps == self.steps_then
            self.in_a_row, self.steps_then = self.in_a_row + 1 if same else 1, worker.local_steps
            if self.in_a_row > self.RETRIES:
                fail("%s: %d sessions in a row lost to restarts, none took a step: is a task "
                     "restarting again and again?" % (worker.role, self.RETRIES))
            print("[%s] lost a step to a restart: a new session (%d in a row)"
                  % (worker.role, self.in_a_row), flush=True)
            time.sleep(self.in_a_row - 1)  # the pace of the tries: 0, 1, 2 ... s
        reach_the_ps(args, worker.cluster)
        self.scaffold.finalize()  # the graph is whole: a loop that adds ops would grow forever
        manager = tf.compat.v1.train.SessionManager(
            local_init_op=self.scaffold.local_init_op, ready_op=self.scaffold.ready_op,
            ready_for_local_init_op=self.scaffold.ready_for_local_init_op,
            recovery_wait_secs=1)
        # filter devices, or the session waits for every worker to answer, even those that left
        config = tf.compat.v1.ConfigProto(device_filters=[
            "/job:ps", "/job:worker/task:%d" % args.task_index], intra_op_parallelism_threads=1)
        if worker.is_chief:
            session = manager.prepare_session(self.server.target, config=config,
                                              init_fn=worker.restore_or_initialise)
        else:
            try:
                session = manager.wait_for_session(self.server.target, config=config,
                                                   max_wait_secs=args.connect_timeout)
            except tf.errors.DeadlineExceededError:
                fail("%s: the chief has not set the variables up after %g s"
                     % (worker.role, args.connect_timeout))
        worker.started_at = int(session.run(worker.global_step))  # this session's start
        start_the_data(session, worker.started_at)  # an order of this session's
        if worker.sessions == 1 and not worker.rejoins and session.run(
                worker.status)[args.task_index] != worker.NOT_STARTED:  # it started once already
            fail("%s: %s cannot take a restarted worker back into a run in progress; start "
                 "the whole run again" % (worker.role, EXAMPLE))
        session.run(worker.set_my_status, {worker.my_status: [worker.TRAINING]})
        absent = lambda: [k for k, s in enumerate(session.run(worker.status))
                          if s == worker.NOT_STARTED]
        if self.wait_for_everyone and not wait_for(
                lambda: not absent(), args.connect_timeout, waiting=lambda: (
                    "[%s] waiting for worker(s) %s to start" % (worker.role, ",".join(
                        map(str, absent()))))):
            fail("%s: worker(s) %s did not start within %g s, and every round needs every "
                 "worker" % (worker.role, ",".join(map(str, absent())), args.connect_timeout))
        return session


class Hook(object):
    """tf.compat.v1.train.SessionRunHook's five methods, each doing nothing: the base of this
    file's hooks (TensorFlow loads after the flags are checked, so none derives from its own)."""
    begin = after_create_session = before_run = after_run = end = lambda self, *args: None


class RunStatus(Hook):
    """The run's status on ps 0, which TensorFlow lacks (StartOrRejoin marks a worker
    TRAINING). At its end a worker writes its local steps there; the chief then waits for every
    other worker to finish, to close its port while TRAINING (lost), or, NOT_STARTED, not to
    start within --connect_timeout, and names those it lost and those that never started."""

    def __init__(self, worker):
        self.worker = worker

    def end(self, session):
        worker = self.worker
        session.run(worker.set_my_status, {worker.my_status: [worker.local_steps]})
        if not worker.is_chief:
            return
        workers, my_end = worker.cluster["worker"], time.time()

        def still_to_come():  # neither finished, nor lost, nor too late to start
            late = time.time() > my_end + worker.args.connect_timeout
            return [k for k, s in enumerate(worker.read_status(session))
                    if s == worker.TRAINING and is_listening(workers[k])
                    or s == worker.NOT_STARTED and not late]
        wait_for(lambda: not still_to_come(), waiting=lambda: (
            "[worker0] waiting for worker(s) %s to finish" % ",".join(map(str, still_to_come()))))
        status = worker.read_status(session)  # after the wait
        lost = [k for k, s in enumerate(status) if s == worker.TRAINING]
        absent = [k for k, s in enumerate(status) if s == worker.NOT_STARTED]
        if lost:
            print("[worker0] worker(s) %s failed or were lost" % ",".join(map(str, lost)))
        if absent:
            print("[worker0] worker(s) %s never started (waited %g s)"
                  % (",".join(map(str, absent)), worker.args.connect_timeout))


class Progress(Hook):
    """A progress line every --log_every local steps, after each run of the update (the
    step's loss and global step fetched with it); on the chief with the test metrics over the
    test set, also to TensorBoard. At the end the chief's summary line, after which the run is
    over: every ps's run-over flag raised. (TensorFlow's LoggingTensorHook prints a step's
    tensors, not metrics of a test set fed in batches, nor a run's summary.)"""

    def __init__(self, worker, loss, update, minibatches_per_update, summary, last_step=None):
        self.worker, self.loss, self.update, self.last_step = worker, loss, update, last_step
        self.minibatches_per_update, self.summary = minibatches_per_update, summary
        self.history = []

    def begin(self):
        if self.worker.is_chief:  # the writer CheckpointSaverHook adds the graph to
            self.writer = tf.compat.v1.summary.FileWriterCache.get(self.worker.args.log_dir)

    def after_create_session(self, session, coord):
        self.step = self.worker.started_at  # the global step as this session starts
        if self.last_step and self.step >= self.last_step:  # the run is over: stop now
            coord.request_stop()  # (StopAtStepHook looks only after a step)
        if self.worker.sessions == 1:
            self.start_step = self.step
            self.start_clock()  # again at the first update
            print("[%s] training started" % self.worker.role, flush=True)

    def start_clock(self):
        """The run's clock (its rates, its history's seconds) starts once the first update has
        returned, in every example: set-up, and the first step's own preparation, untimed."""
        self.start_time = self.progress_time = time.time()
        self.timed_from_step, self.progress_steps = self.step, self.worker.local_steps

    def before_run(self, run_context):
        """A run of the update is a step: its value (the global step after it, which the run
        fetches anyway) comes back, the loss too with the first and with each that ends a
        --log_every interval (a fetch costs on every step)."""
        worker, fetches = self.worker, run_context.original_args.fetches
        self.updating = fetches is self.update or any(  # not a read
            fetch is self.update for fetch in tf.nest.flatten(fetches))
        seen = {worker.step_seen: self.step}  # the hooks' global step (Worker.step_seen)
        if not self.updating:
            return tf.compat.v1.train.SessionRunArgs(None, seen)
        every, after = worker.args.log_every, worker.local_steps + worker.steps_per_update
        if worker.local_steps == 0 or worker.local_steps // every != after // every:
            return tf.compat.v1.train.SessionRunArgs({"step": self.update, "loss": self.loss}, seen)
        return tf.compat.v1.train.SessionRunArgs({"step": self.update}, seen)

    def after_run(self, run_context, run_values):
        """Count the update; stop at last_step; every --log_every local steps a progress line."""
        worker = self.worker
        if not self.updating:
            return
        before = worker.local_steps
        worker.local_steps += worker.steps_per_update
        self.step = int(run_values.results["step"])
        if self.last_step and self.step >= self.last_step:  # as this update returns: the
            run_context.request_stop()  # global step StopAtStepHook reads may be an older one
        if "loss" not in run_values.results:
            return
        loss = float(run_values.results["loss"])
        if before == 0:  # the clock starts as the first update returns (start_clock)
            self.start_clock()
        if before // worker.args.log_every == worker.local_steps // worker.args.log_every:
            return
        rate = (worker.local_steps - self.progress_steps) / (time.time() - self.progress_time)
        line = "[%s] local_step=%d global_step=%d loss=%.4f" % (
            worker.role, worker.local_steps, self.step, loss)
        if worker.is_chief:
            for name, value in self.evaluate(run_context.session, self.step, loss).items():
                line += " test_%s=%.4f" % (name, value)
            worker.read_status(run_context.session)
        print(line + " steps_per_sec=%.1f" % rate, flush=True)
        self.progress_steps, self.progress_time = worker.local_steps, time.time()

    def evaluate(self, session, global_step, loss=None):
        """The test metrics, each a mean over the test set, fed 1000 examples at a time (a large
        test set is never a graph constant); also to TensorBoard, with the loss if given."""
        worker = self.worker
        metrics = test_metrics_in_batches(session, worker.test_metrics, worker.test_x,
                                          worker.test_y, worker.test_set)
        self.writer.add_summary(tensorboard_summary(metrics, loss), global_step)
        seconds = round(time.time() - self.start_time, 3)
        self.history.append([seconds, global_step] + list(metrics.values()))
        return metrics

    def end(self, session):
        """The chief's summary line, with the example's fields, once RunStatus has waited for
        the others and CheckpointSaverHook has saved; then the run is over."""
        worker = self.worker
        if worker.is_chief:
            status = worker.status_seen  # as RunStatus read it after its wait
            self.step = int(session.run(worker.global_step))
            summary = dict(example=EXAMPLE)
            for name, value in self.evaluate(session, self.step).items():  # what it saved
                summary["test_" + name] = value
            seconds = time.time() - self.start_time
            rate = (self.step - self.timed_from_step) * self.minibatches_per_update / seconds
            lost = [k for k, s in enumerate(status) if s in (worker.TRAINING, worker.NOT_STARTED)]
            summary.update(global_step=self.step, workers=len(worker.cluster["worker"]),
                           ps=len(worker.cluster["ps"]), lost_workers=len(lost),
                           local_steps=[max(int(s), -1) for s in status],
                           updates=self.step - self.start_step,
                           timed_from_step=self.timed_from_step, timed_seconds=seconds,
                           steps_per_sec=rate, examples_per_sec=rate * worker.args.batch_size)
            for key, value in self.summary.items():  # a value, a tensor, or a function
                value = value() if callable(value) else value
                summary[key] = float(session.run(value)) if tf.is_tensor(value) else value
            print_summary(worker.role, summary, self.history, worker.args.metrics_file)
            self.writer.flush()
            session.run(worker.end_run)  # the ps tasks end now
        print("[%s] done: local_steps=%d" % (worker.role, worker.local_steps), flush=True)


class ExampleHook(Hook):
    """An example's own start-up, each_session(session), run in every new session (after a
    restart too), and its own end, at_the_end(session), before the chief waits for the others:
    a synchronous optimizer's start-up and the spare tokens that release its workers."""

    def __init__(self, each_session, at_the_end=None):
        self.each_session, self.at_the_end = each_session, at_the_end

    def after_create_session(self, session, coord):
        self.each_session(session)

    def end(self, session):
        if self.at_the_end:
            self.at_the_end(session)


class Watchdog(Hook):
    """Once steps have begun, a worker that completes none for --watchdog seconds says so and
    ends its process, for its restart policy to start it again: a step that a peer's restart
    left waiting may never return, and nothing in TensorFlow interrupts it."""

    def __init__(self, role, seconds):
        self.role, self.seconds, self.last_step, self.watching = role, seconds, None, True

    def after_run(self, run_context, run_values):
        if self.last_step is None:  # the first step: the watch begins
            threading.Thread(target=self.watch, daemon=True).start()
        self.last_step = time.time()

    def watch(self):
        while self.watching:
            time.sleep(1)
            if self.watching and time.time() > self.last_step + self.seconds:
                print("error: %s completed no step for %g s (--watchdog): exiting, so that it "
                      "can be restarted" % (self.role, self.seconds), file=sys.stderr,
                      flush=True)
                os._exit(2)  # sys.exit would wait for the stuck step

    def end(self, session):
        self.watching = False
# <<< shared: cluster and session


if __name__ == "__main__":
    sys.exit(main())

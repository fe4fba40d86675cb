"""DOWNPOUR: workers train local copies and push accumulated gradients to an Adagrad ps.

What it teaches: talking to the parameter server less often. Each worker trains its own copy of
the parameters for a window of mini-batches with no network traffic, then pushes the sum of its
gradients and pulls the result. Adagrad on the ps, where each parameter's step shrinks with the
gradients it has had, is what Dean et al. found keeps many asynchronous replicas stable. Repeat:
    window times, on worker k alone:  g <- grad L(local_params; next mini-batch of k)
        local_params <- local_params - learning_rate * g  (or local Adagrad);  accumulated += g
    push:  global_params <- Adagrad(global_params, accumulated) on the ps;  accumulated <- 0
    pull:  local_params <- global_params  (also once when the worker starts)

Run it: bash run.sh [--window 10 --local_optimizer adagrad], or as in ../Distributed-Setup.
References: J. Dean et al., "Large Scale Distributed Deep Networks", NIPS 2012, Sec. 4.1; J. Duchi
et al., "Adaptive Subgradient Methods for Online Learning and Stochastic Optimization", JMLR 2011.
"""
import argparse
import collections
import contextlib
import json
import math
import os
import socket
import sys
import threading
import time

import numpy as np

tf = None  # loaded once the flags are checked: bad input fails in one line, at once
EXAMPLE = "DOWNPOUR"
JOBS = ("ps", "worker")  # the jobs of its cluster; deploy/ and the tests read them here


def example_flags(parser):
    add = parser.add_argument
    add("--window", type=positive_int, default=5, help="local mini-batch steps between two pushes")
    add("--local_optimizer", default="sgd", choices=("sgd", "adagrad"),
        help="how a worker trains its local copy between pushes")
    add("--ps_optimizer", default="adagrad", choices=("adagrad", "sgd"),
        help="how the ps applies a push: adagrad (the paper's stabiliser) or sgd")
    add("--ps_learning_rate", type=positive_float, default=0.1,
        help="learning rate of the ps optimizer")


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
Downpour = collections.namedtuple("Downpour", "global_params local_params accumulated_gradients "
                                  "global_step loss local_step push pull push_and_pull")


def build_downpour(args, cluster, x, y, num_classes=10):
    """This worker's ops on the mini-batch stream (x, y): the steps of the update rule above."""
    worker = "/job:worker/task:%d" % args.task_index
    # placement: every variable made in this scope goes to a ps task (in turn), every other op
    # to this worker
    on_the_ps = tf.compat.v1.train.replica_device_setter(
        cluster=cluster, worker_device="/job:worker/task:%d" % args.task_index)
    with tf.compat.v1.device(on_the_ps):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        global_params = model_params(x.shape[1:], args.hidden, args.seed, num_classes)
    with tf.compat.v1.device(worker):  # local_params read the ps: the session waits for it
        local_params = worker_variables("local", global_params, lambda p: p.read_value())
        accumulated = worker_variables("accumulated", global_params, lambda p: tf.zeros(p.shape))
        loss = model_loss(local_params, x, y)
        gradients = tf.gradients(loss, list(local_params.values()))
        adds = [a.assign_add(g, read_value=False) for a, g in zip(accumulated.values(), gradients)]
        with tf.control_dependencies(adds + local_optimizer(args, local_params, gradients)):
            local_step = tf.identity(loss, name="local_step")
    ps_optimizer = (tf.compat.v1.train.AdagradOptimizer if args.ps_optimizer == "adagrad" else
                    tf.compat.v1.train.GradientDescentOptimizer)(args.ps_learning_rate)
    with tf.control_dependencies([ps_optimizer.apply_gradients(  # on the ps: only the sum travels
            [(a.read_value(), p) for a, p in zip(accumulated.values(), global_params.values())])]):
        restart = [a.assign(tf.zeros(a.shape), read_value=False) for a in accumulated.values()]
    with tf.control_dependencies(restart):  # the global step counts a push once it is done
        push = tick(global_step)
    def copy_global_to_local():  # one read of the ps per parameter
        return tf.group(*[local_params[n].assign(theta) for n, theta in global_params.items()])
    pull = copy_global_to_local()
    with tf.control_dependencies([push]):
        with tf.control_dependencies([copy_global_to_local()]):  # built after the push: it waits
            push_and_pull = tf.identity(push)
    return Downpour(global_params, local_params, accumulated, global_step, loss, local_step, push,
                    pull, push_and_pull)


# >>> shared: worker variables
def worker_variables(prefix, like, initial_value):
    """One variable on this worker per parameter in like, named prefix_<name>. LOCAL_VARIABLES:
    each worker initialises its own, and checkpoints leave them out."""
    return {n: tf.compat.v1.Variable(initial_value(p), trainable=False, name=prefix + "_" + n,
                                     collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])
            for n, p in like.items()}
# <<< shared: worker variables


def local_optimizer(args, local_params, gradients):
    """One local step's updates, written out: they touch only this worker's variables."""
    steps = [args.learning_rate * g for g in gradients]
    if args.local_optimizer == "adagrad":  # its sums outlive pulls: they track this worker's data
        sums = worker_variables("squared_gradients", local_params, lambda p: tf.fill(p.shape, 0.1))
        steps = [step * tf.math.rsqrt(s.assign_add(tf.square(g)))
                 for step, s, g in zip(steps, sums.values(), gradients)]
    return [p.assign_sub(step, read_value=False) for p, step in zip(local_params.values(), steps)]


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
# >>> shared: windowed loop
def train_in_windows(session, args, local_step, push, last_loss):
    """Until the hooks stop it (the global step counts pushes: --steps / --window of them): a
    window of local steps on this worker alone, with no network traffic and no hooks
    (MonitoredSession's run_step_fn hands them the raw session), then one push, run with the
    hooks (its value: the global step it made; the window's last loss fed to last_loss, which
    the progress line reads)."""
    def window(step_context):
        for _ in range(args.window):
            loss = step_context.session.run(local_step)
        return loss
    while not session.should_stop():
        session.run(push, {last_loss: session.run_step_fn(window)})
# <<< shared: windowed loop


def train(args, cluster, server, data):
    x, y = training_batches(data, args.batch_size, args.task_index, len(cluster["worker"]),
                            args.seed)  # no device given: the pipeline runs on this worker
    downpour = build_downpour(args, cluster, x, y, data.num_classes)
    worker = Worker(args, cluster, lambda x, y: model_metrics(downpour.global_params, x, y),
                    data, steps_per_update=args.window)
    push_and_pull, mean_staleness = count_staleness(worker, downpour.push_and_pull)
    last_loss = tf.compat.v1.placeholder(tf.float32, [], name="last_loss")  # a window's
    with worker.session(server, last_loss, push_and_pull,
                        last_step=math.ceil(args.steps / args.window),  # the pushes
                        minibatches_per_update=args.window, window=args.window,
                        local_optimizer=args.local_optimizer, ps_optimizer=args.ps_optimizer,
                        mean_staleness=mean_staleness) as session:
        train_in_windows(session, args, downpour.local_step, push_and_pull, last_loss)
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
# train() hands it what it built (the step's tensors, the test metrics, the data): nothing here
# knows the model or the algorithm. Each block is the same text in every train.py that uses it (a
# test compares them); this file's, in order:
# flags, ps cluster, tasks, npz, records, graph arrays, graph stream, graph test set, summary, ps
# session.
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


# >>> shared: ps cluster
def resolve_cluster(args):
    """The cluster from the flags, or else from TF_CONFIG as operators write it: a "chief" or
    "master" becomes worker 0, an "evaluator" has nothing to do. Sets job_name, task_index,
    address (this task's), and connect_timeout if not given: 60 s, or 600 s under TF_CONFIG."""
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
    args.job_name, args.task_index, args.address = job, index, cluster[job][index]
    return cluster


@contextlib.contextmanager
def errors_in_one_line(args):
    """A TensorFlow error that ends this task (its port taken, a peer lost) as one line."""
    try:
        yield
    except tf.errors.OpError as e:
        if "Could not start gRPC server" in e.message:  # gRPC could not bind the port
            fail("%s %d: port %s is already in use: by an earlier run, or another program?"
                 % (args.job_name, args.task_index, args.address))
        fail("%s %d stopped: %s: %s" % (args.job_name, args.task_index, type(e).__name__,
                                        cause(e)))
# <<< shared: ps cluster


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


# >>> shared: npz
def read_npz(path):
    """--data_path's .npz, checked before TensorFlow loads, as the Dataset's fields. Floats become
    float32; integer pixels stay a byte each, scaled to [0, 1] by x_train's largest (x_scale) in
    the pipeline; images (N, H, W) gain a channel axis; labels are whole numbers from 0."""
    names = ("x_train", "y_train", "x_test", "y_test")
    try:
        with np.load(path) as f:
            x_train, y_train, x_test, y_test = arrays = [f[name] for name in names]
    except (OSError, KeyError, ValueError) as e:  # missing, unreadable, or a key missing
        fail("cannot load %s (%s): give an .npz with x_train, y_train, x_test and y_test"
             % (path, str(e).splitlines()[0]))
    for name, a in zip(names, arrays):
        if a.dtype.kind not in "biuf" or a.ndim == 0 or len(a) == 0:
            fail("%s: %s must be a non-empty array of numbers, not %s %s"
                 % (path, name, a.dtype, a.shape))
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            fail("%s: %s has NaN or infinite values" % (path, name))
        if name[0] == "y" and (a.ndim != 1 or np.any(a != np.round(a)) or a.min() < 0):
            fail("%s: %s must hold class labels: whole numbers from 0" % (path, name))
    if len(x_train) != len(y_train) or len(x_test) != len(y_test):
        fail("%s: x and y differ in length: %d and %d to train, %d and %d to test"
             % (path, len(x_train), len(y_train), len(x_test), len(y_test)))
    if x_train.shape[1:] != x_test.shape[1:]:
        fail("%s: train and test examples differ in shape: %s and %s"
             % (path, x_train.shape[1:], x_test.shape[1:]))
    if x_train.ndim == 3:  # images without a channel axis
        x_train, x_test = x_train[..., np.newaxis], x_test[..., np.newaxis]
    scale = max(float(x_train.max()), 1.0) if x_train.dtype.kind in "biu" else 1.0
    if scale == 1.0:
        x_train, x_test = x_train.astype(np.float32), x_test.astype(np.float32)
    num_classes = int(max(y_train.max(), y_test.max())) + 1
    return x_train, y_train.astype(np.int64), x_test, y_test.astype(np.int64), num_classes, scale
# <<< shared: npz


# >>> shared: records
class Records(collections.namedtuple("Records", "train_files test_files shape dtype x_scale "
                                           "num_classes")):
    """--data_path's TFRecord files (read_records), and their test set as it streams."""

    def test_batches(self, size):
        return tf.data.TFRecordDataset(self.test_files).batch(size).map(parse_records(self))


def read_records(folder):
    """--data_path's folder as tools/npz_to_tfrecord.py writes it: train-*.tfrecord and
    test-*.tfrecord (tf.train.Examples of x, the array's bytes, and y) and meta.json."""
    try:
        names = sorted(os.listdir(folder))
        train_files, test_files = ([os.path.join(folder, name) for name in names if name.startswith(
            part + "-") and name.endswith(".tfrecord")] for part in ("train", "test"))
        if not train_files or not test_files:
            raise ValueError("no %s-*.tfrecord files" % ("test" if train_files else "train"))
        with open(os.path.join(folder, "meta.json")) as f:
            meta = json.load(f)
        return Records(train_files, test_files, tuple(meta["x_shape"]), np.dtype(meta["x_dtype"]),
                       float(meta["x_scale"]), meta["num_classes"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail("%s is no folder of TFRecord files (%s): write one with python "
             "tools/npz_to_tfrecord.py DATA.npz FOLDER" % (folder, e))


def records_dataset(data, batch_size, worker_index, num_workers, seed):
    """This worker's endless stream of mini-batches from its own files (file k goes to worker
    k mod N): no worker reads the whole set. Every epoch its files in a new order, interleaved,
    the records shuffled in a buffer of 10,000, batched, then parsed a batch at a time."""
    if len(data.train_files) < num_workers:
        fail("%d training file(s) for %d workers: each worker reads files of its own; write at "
             "least %d (npz_to_tfrecord.py --shards)" % (len(data.train_files), num_workers,
                                                         num_workers))
    if isinstance(worker_index, int):  # (a tensor under ParameterServerStrategy)
        print("[worker%d] reading training files: %s" % (worker_index, ",".join(os.path.basename(
            f) for f in data.train_files[worker_index::num_workers])), flush=True)
    files = tf.data.Dataset.from_tensor_slices(data.train_files).shard(num_workers, worker_index)
    records = files.shuffle(len(data.train_files), seed=seed).interleave(
        tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE)
    records = records.shuffle(10000, seed=seed).repeat().batch(batch_size, drop_remainder=True)
    return records.map(parse_records(data), tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def parse_records(data):
    """The parser of a batch of records (training's, the test set's): x scaled to [0, 1], y."""
    def parse(serialized):
        features = tf.io.parse_example(serialized, {
            "x": tf.io.FixedLenFeature([], tf.string),
            "y": tf.io.FixedLenFeature([], tf.int64 if data.num_classes else tf.float32)})
        x = tf.reshape(tf.io.decode_raw(features["x"], data.dtype), (-1,) + data.shape)
        return tf.cast(x, tf.float32) / data.x_scale, features["y"]
    return parse
# <<< shared: records


# >>> shared: graph arrays
def arrays_dataset(x, y, worker_index, num_workers, seed, scale=1.0):
    """This worker's shard of the arrays (x, y), example by example, in a new order every epoch,
    integer pixels divided by scale. No constant of the graph (its GraphDef would hold the
    arrays: 2 GB at most, and copies in memory): it asks Python for them as it starts."""
    shard = (x[worker_index::num_workers], y[worker_index::num_workers])
    examples = tf.data.Dataset.from_generator(lambda: [shard], output_signature=tuple(
        tf.TensorSpec((None,) + a.shape[1:], a.dtype) for a in shard)).unbatch()
    examples = examples.shuffle(len(x) // num_workers + 1, seed=seed)  # the shards differ
    if x.dtype.kind not in "biu":  # floats as they are; integer pixels scaled
        return examples
    return examples.map(lambda xs, ys: (tf.cast(xs, tf.float32) / scale, ys))
# <<< shared: graph arrays


# >>> shared: graph stream
def session_stream(dataset, seed, worker_index):
    """The next element of dataset(session_seed), as tensors of the graph. Every session starts
    the stream anew (start_the_data), its seed drawn from seed, this worker and the global step
    at the session's start: no two workers share an order, and after a restart or a resume a
    worker does not replay the mini-batches it began with."""
    start_step = tf.compat.v1.placeholder_with_default(np.int64(0), [], name="data_start_step")
    iterator = tf.compat.v1.data.make_initializable_iterator(
        dataset((seed * 1000 + worker_index) * 1000003 + start_step))
    tf.compat.v1.add_to_collection("data_starts", (iterator.initializer, start_step))
    return iterator.get_next()


def start_the_data(session, global_step):
    """Start every training stream of the graph (session_stream), in a new session."""
    for initializer, start_step in tf.compat.v1.get_collection("data_starts"):
        session.run(initializer, {start_step: global_step})
# <<< shared: graph stream


# >>> shared: graph test set
def test_metrics_of(test_metrics, data):
    """The test set, 1000 examples a batch, x in float32 as in training: a start op, each batch's
    (size, test_metrics(x, y)) and its feeds. TFRecord files stream (they may not fit in memory;
    feeds None: to the end); arrays are fed (no graph constant, and no stream to start: fast)."""
    if hasattr(data, "test_batches"):  # Records
        iterator = tf.compat.v1.data.make_initializable_iterator(data.test_batches(1000))
        x, y = iterator.get_next()
        return iterator.initializer, (tf.shape(x)[0], test_metrics(x, y)), None
    xs, y = (tf.compat.v1.placeholder(a.dtype, (None,) + a.shape[1:])
             for a in (data.x_test, data.y_test))
    scale = getattr(data, "x_scale", None)  # a Dataset's (integer pixels), none for other ids
    x = tf.cast(xs, tf.float32) / scale if scale and data.x_test.dtype.kind in "biu" else xs
    feeds = [{xs: data.x_test[i:i + 1000], y: data.y_test[i:i + 1000]}
             for i in range(0, len(data.x_test), 1000)]
    return None, (tf.shape(x)[0], test_metrics(x, y)), feeds


def mean_over_the_test_set(session, start, batch, feeds):
    """Each test metric, a mean over a batch, averaged over every example of the test set."""
    if start is not None:
        session.run(start)
    totals, examples = collections.Counter(), 0
    for feed in iter(dict, None) if feeds is None else feeds:  # (the stream's: {} until it ends)
        try:
            size, metrics = session.run(batch, feed)
        except tf.errors.OutOfRangeError:
            break
        totals.update({name: value * size for name, value in metrics.items()})
        examples += size
    return {name: float(totals[name] / examples) for name in metrics}
# <<< shared: graph test set


# >>> shared: summary
def print_summary(role, summary):
    """The run's last line, key=value ...: what users, the tests and the benchmarks read."""
    text = lambda v: (",".join(map(str, v)) if isinstance(v, list)
                      else "%.6g" % v if isinstance(v, float) else str(v))
    print("[%s] summary %s" % (role, " ".join("%s=%s" % (k, text(v)) for k, v in summary.items())),
          flush=True)
# <<< shared: summary


# >>> shared: ps session
def run_over_flag(ps_index):
    """A flag on each ps that the chief raises when the run is over: each ps reads its own."""
    with tf.compat.v1.device("/job:ps/task:%d" % ps_index):
        return tf.compat.v1.Variable(False, collections=[], name="run_over_%d" % ps_index)


def serve(args, cluster, server):
    """A ps serves until the chief says the run is over (a TensorFlow server never ends by
    itself). One whose flag no chief has set up within --connect_timeout, while the chief's port
    stays closed, served no one: an error (a chief that listens may be building a large graph).
    The flag has the same name in every task's graph, so the ps reads what the chief writes."""
    index, chief = args.task_index, cluster["worker"][0]
    with tf.Graph().as_default():
        run_over = run_over_flag(index)
        set_up = tf.compat.v1.is_variable_initialized(run_over)
        session = tf.compat.v1.Session(server.target, config=tf.compat.v1.ConfigProto(
            device_filters=["/job:ps/task:%d" % index]))  # this ps alone: nothing else to wait for
    print("[ps%d] serving %d worker(s) at %s" % (index, len(cluster["worker"]), args.address),
          flush=True)
    while not wait_for(lambda: session.run(set_up), args.connect_timeout, waiting=lambda: (
            "[ps%d] waiting for the chief (worker0) at %s" % (index, chief))):
        if not is_listening(chief):
            fail("ps%d: no chief at %s within %g s: this ps served no one"
                 % (index, chief, args.connect_timeout))
    wait_for(lambda: session.run(run_over))
    print("[ps%d] the run is over; shutting down" % index, flush=True)
    return 0


class Hook(object):
    """A SessionRunHook that does nothing but the methods given, as Hook(end=f) (TensorFlow
    loads after the flags are checked, so no class here derives from its own)."""
    begin = after_create_session = before_run = after_run = end = lambda *args: None

    def __init__(self, **methods):
        self.__dict__.update(methods)


class Worker(Hook):
    """This worker's part of the run besides its algorithm, handed test_metrics(x, y) and the
    data. session() is TensorFlow's MonitoredSession with this object its session creator and a
    hook (progress, the chief's test metrics, the watchdog, the end). The run's status lives on
    ps 0, never checkpointed: for each worker NOT_STARTED, TRAINING, or its local steps once
    finished (the chief's last read written back if ps 0 restarts)."""
    NOT_STARTED, TRAINING = -2, -1

    def __init__(self, args, cluster, test_metrics, data, steps_per_update=1):
        self.args, self.cluster, self.steps_per_update = args, cluster, steps_per_update
        self.role, self.is_chief = "worker%d" % args.task_index, args.task_index == 0
        self.global_step = tf.compat.v1.train.get_or_create_global_step()
        workers = len(cluster["worker"])
        with tf.compat.v1.device("/job:worker/task:%d" % args.task_index):
            self.test_set = test_metrics_of(test_metrics, data)
            self.seen = tf.compat.v1.placeholder_with_default(
                np.full(workers, self.NOT_STARTED, np.int64), [workers])
            self.mine = tf.compat.v1.placeholder(tf.int64, [1])
        with tf.compat.v1.device("/job:ps/task:0"):
            self.status = tf.compat.v1.Variable(self.seen, collections=[], name="run_status")
        self.set_mine = tf.compat.v1.scatter_update(self.status, [args.task_index], self.mine)
        self.run_over = [run_over_flag(k) for k in range(len(cluster["ps"]))]
        self.end_run = tf.group([flag.assign(True) for flag in self.run_over])
        self.local_steps, self.sessions, self.status_seen, self.start_step = 0, 0, None, None
        self.watching = self.ps_lost = self.kept_variables = False

    def session(self, server, loss, update, last_step=None, hooks=(), minibatches_per_update=1,
                **summary):
        """The session on server, with TensorFlow's StopAtStepHook at last_step (None: the
        example stops itself), the example's hooks, and the chief's CheckpointSaverHook (as a
        session starts, every 30 s, at the end). update: a step's tensor, its value the global
        step after it; loss: the step's, or a placeholder it feeds; summary: the example's fields
        of the summary line (values, tensors or functions)."""
        self.server, self.loss, self.update, self.last_step = server, loss, update, last_step
        self.minibatches_per_update, self.summary = minibatches_per_update, summary
        self.saver = tf.compat.v1.train.Saver()  # every global variable; the save runs here
        variables = tf.compat.v1.global_variables()  # by ps: what a restarted one lacks
        self.by_ps = [(ps[5:].replace("/task:", ""), tf.compat.v1.report_uninitialized_variables(
            mine), tf.compat.v1.train.Saver(mine), tf.compat.v1.variables_initializer(mine))
            for ps in sorted({v.device for v in variables})
            for mine in [[v for v in variables if v.device == ps]]]
        self.set_up = [(tf.compat.v1.is_variable_initialized(v), v.initializer)
                       for v in [self.status] + self.run_over]
        everything = variables + tf.compat.v1.local_variables() + [self.status] + self.run_over
        self.scaffold = tf.compat.v1.train.Scaffold(
            saver=self.saver, ready_op=tf.compat.v1.report_uninitialized_variables(everything))
        hooks = ([tf.compat.v1.train.StopAtStepHook(last_step=last_step)] if last_step else []
                 ) + list(hooks) + [Hook(end=self.wait_for_the_others)]
        if self.is_chief:
            print("[worker0] chief: log_dir=%s" % self.args.log_dir, flush=True)
            self.writer = tf.compat.v1.summary.FileWriterCache.get(self.args.log_dir)
            hooks.append(tf.compat.v1.train.CheckpointSaverHook(
                self.args.log_dir, save_secs=30, saver=self.saver))
        return tf.compat.v1.train.MonitoredSession(session_creator=self, hooks=hooks + [self])

    def create_session(self):
        """SessionManager's start-up, as TensorFlow's ChiefSessionCreator and WorkerSessionCreator
        make it, with two defaults corrected: the chief's prepare_session gets no checkpoint_dir
        (it would restore whenever a checkpoint exists, even over a ps that kept the run) but
        init_fn=restore_where_lost; the others' wait_for_session checks every second, not every
        30 s, for at most --connect_timeout. MonitoredSession calls it again after a step lost
        to a restarted task (Aborted, Unavailable)."""
        args, role = self.args, self.role
        self.watching = False  # waiting for the ps, or the chief, is no stuck step
        if self.sessions:
            print("[%s] lost a step to a restart: a new session" % role, flush=True)
        silent = lambda: [ps for ps in self.cluster["ps"] if not is_listening(ps)]
        if not wait_for(lambda: not silent(), args.connect_timeout, waiting=lambda: (
                "[%s] waiting for the ps at %s" % (role, ",".join(silent())))):
            fail("%s: cannot reach the ps at %s: is it running?" % (role, ",".join(silent())))
        self.scaffold.finalize()  # the graph is whole: a loop that adds ops would grow forever
        manager = tf.compat.v1.train.SessionManager(
            local_init_op=self.scaffold.local_init_op, ready_op=self.scaffold.ready_op,
            ready_for_local_init_op=self.scaffold.ready_for_local_init_op, recovery_wait_secs=1)
        # filter devices, or the session waits for every worker to answer, even those that left
        config = tf.compat.v1.ConfigProto(device_filters=[
            "/job:ps", "/job:worker/task:%d" % args.task_index], intra_op_parallelism_threads=1)
        if self.is_chief:
            session = manager.prepare_session(self.server.target, config=config,
                                              init_fn=self.restore_where_lost)
        else:
            try:
                session = manager.wait_for_session(self.server.target, config=config,
                                                   max_wait_secs=args.connect_timeout)
            except tf.errors.DeadlineExceededError:
                fail("%s: the chief has not set the variables up after %g s"
                     % (role, args.connect_timeout))
        self.step = int(session.run(self.global_step))  # this session's start
        start_the_data(session, self.step)  # an order of this session's
        self.rejoining = self.sessions > 0 or (  # in the run before: a restarted task
            session.run(self.status)[args.task_index] != self.NOT_STARTED)
        session.run(self.set_mine, {self.mine: [self.TRAINING]})
        self.sessions += 1
        return session

    def restore_where_lost(self, session):
        """The chief's init_fn: the status and run-over flags set up where missing; each ps that
        lacks its variables (a new run, a ps restarted) gets the latest checkpoint's, or with
        none their initial values; a ps that kept them goes on (a restarted chief too)."""
        for is_set_up, initializer in self.set_up:
            if not session.run(is_set_up):
                session.run(initializer, {} if self.status_seen is None else {
                    self.seen: self.status_seen})
        lost = [(ps, saver, init) for ps, missing, saver, init in self.by_ps
                if len(session.run(missing))]
        checkpoint, self.kept_variables = tf.train.latest_checkpoint(self.args.log_dir), not lost
        for ps, saver, init in lost:
            saver.restore(session, checkpoint) if checkpoint else session.run(init)
        lost_ps = ",".join(ps for ps, _, _ in lost) if len(lost) < len(self.by_ps) else ""
        if lost_ps and not checkpoint:
            print("[worker0] %s lost its variables, and %s holds no checkpoint: they start "
                  "again from their initial values" % (lost_ps, self.args.log_dir), flush=True)
        elif lost and checkpoint:
            print("[worker0] resuming from the checkpoint at global step %d%s" % (session.run(
                self.global_step), " on " + lost_ps if lost_ps else ""), flush=True)
        elif not lost and not self.sessions:
            print("[worker0] resuming at global step %d: the ps kept the variables"
                  % session.run(self.global_step), flush=True)

    def after_create_session(self, session, coord):
        """The clock starts with the first session that came up; one that finds the run over
        stops."""
        if self.start_step is None:
            self.start_step = self.timed_from = self.step
            self.clock = time.time()
            print("[%s] training started" % self.role, flush=True)
            threading.Thread(target=self.watch, daemon=True).start()
        self.over = bool(self.last_step) and self.step >= self.last_step
        if self.over:
            coord.request_stop()  # (StopAtStepHook looks only after a step)

    def before_run(self, run_context):
        """A run of the update fetches its value (the global step after it) and the loss. A
        run that MonitoredSession retries in a new session that found the run over ends it
        instead: run again, it would land past last_step."""
        if self.over:
            raise tf.errors.OutOfRangeError(None, None, "the run is over")  # a clean end
        fetches = run_context.original_args.fetches
        self.updating = fetches is self.update or any(
            fetch is self.update for fetch in tf.nest.flatten(fetches))
        if self.updating:
            return tf.compat.v1.train.SessionRunArgs((self.update, self.loss))

    def after_run(self, run_context, run_values):
        """Count the update; stop at last_step as it returns (StopAtStepHook's own read of the
        global step may be an older one); a progress line every --log_every local steps."""
        if not self.updating:
            return
        self.last_run, self.watching, self.ps_lost = time.time(), True, False
        before, self.local_steps = self.local_steps, self.local_steps + self.steps_per_update
        self.step, loss = int(run_values.results[0]), float(run_values.results[1])
        if self.last_step and self.step >= self.last_step:
            run_context.request_stop()
        if before == 0:  # the clock starts as the first update returns
            self.clock, self.timed_from = time.time(), self.step
            self.progress = (before, self.clock)
        if before // self.args.log_every == self.local_steps // self.args.log_every:
            return
        rate = (self.local_steps - self.progress[0]) / (time.time() - self.progress[1])
        line = "[%s] local_step=%d global_step=%d loss=%.4f" % (
            self.role, self.local_steps, self.step, loss)
        if self.is_chief:
            for name, value in self.evaluate(run_context.session, loss).items():
                line += " test_%s=%.4f" % (name, value)
            self.status_seen = run_context.session.run(self.status)  # written back if ps 0 restarts
        print(line + " steps_per_sec=%.1f" % rate, flush=True)
        self.progress = (self.local_steps, time.time())

    def evaluate(self, session, loss=None):
        """The test metrics over the test set, to TensorBoard too (with the loss, if given)."""
        metrics = mean_over_the_test_set(session, *self.test_set)
        values = [("test_" + name, value) for name, value in metrics.items()]
        self.writer.add_summary(tf.compat.v1.Summary(value=[
            tf.compat.v1.Summary.Value(tag=tag, simple_value=value) for tag, value in
            values + ([("loss", loss)] if loss is not None else [])]), self.step)
        return metrics

    def watch(self):
        """The watchdog: a worker whose step has not returned for --watchdog seconds ends its
        process, for a restart policy to start it again (a step that a peer's restart left
        waiting may never return). Once a ps is lost, the wait for it to come back (in the
        step, in gRPC's back-off, in a new session's start-up) has --connect_timeout."""
        while True:
            time.sleep(1)
            if not all(is_listening(ps) for ps in self.cluster["ps"]):
                self.ps_lost = True  # until the next step returns (after_run)
            flag = "--connect_timeout: a ps was lost" if self.ps_lost else "--watchdog"
            limit = self.args.connect_timeout if self.ps_lost else self.args.watchdog
            if self.watching and time.time() > self.last_run + limit:
                print("error: %s completed no step for %g s (%s): exiting, so that it can be "
                      "restarted" % (self.role, limit, flag), file=sys.stderr, flush=True)
                os._exit(2)  # sys.exit would wait for the stuck step

    def wait_for_the_others(self, session):
        """Before the chief's last checkpoint: this worker's local steps into the run's status;
        the chief then waits until every other worker has finished, has closed its port while
        TRAINING (lost), or, NOT_STARTED, has not started within --connect_timeout."""
        self.watching = False
        session.run(self.set_mine, {self.mine: [self.local_steps]})
        workers, my_end = self.cluster["worker"], time.time()

        def still_to_come():
            late = time.time() > my_end + self.args.connect_timeout
            self.status_seen = session.run(self.status)
            return [k for k, s in enumerate(self.status_seen) if s == self.TRAINING and
                    is_listening(workers[k]) or s == self.NOT_STARTED and not late]
        if self.is_chief:
            wait_for(lambda: not still_to_come(), waiting=lambda: "[worker0] waiting for "
                     "worker(s) %s to finish" % ",".join(map(str, still_to_come())))

    def end(self, session):
        """The chief's summary line, with the example's fields, once the others have finished and
        CheckpointSaverHook has saved; then the run is over: every ps's flag raised."""
        if self.is_chief:
            seconds = time.time() - self.clock  # the training's: not the last evaluation
            self.step, status = int(session.run(self.global_step)), self.status_seen
            summary = dict(example=EXAMPLE)
            summary.update(("test_" + n, v) for n, v in self.evaluate(session).items())
            lost = sum(s < 0 for s in status)  # TRAINING or NOT_STARTED
            if lost:
                print("[worker0] %d worker(s) failed, were lost or never started" % lost)
            summary.update(global_step=self.step, workers=len(status), ps=len(self.cluster["ps"]),
                           lost_workers=lost, local_steps=[max(int(s), -1) for s in status],
                           updates=self.step - self.start_step, steps_per_sec=(
                               self.step - self.timed_from) * self.minibatches_per_update / seconds)
            for key, value in self.summary.items():  # a value, a tensor, or a function
                value = value() if callable(value) else value
                summary[key] = float(session.run(value)) if tf.is_tensor(value) else value
            print_summary(self.role, summary)
            self.writer.flush()
            session.run(self.end_run)  # the ps tasks end now
        print("[%s] done: local_steps=%d" % (self.role, self.local_steps), flush=True)
# <<< shared: ps session


if __name__ == "__main__":
    sys.exit(main())

"""Model-Parallel-Pipeline: the model's layers split over the worker tasks, and GPipe's pipeline.

What it teaches
    Model parallelism: when a model is too big for one machine, its layers go to several, in
    stages, each stage's variables on its own task; the activations cross to the next stage,
    and the gradients come back. Run naively, stage 2 waits while stage 1 computes and the
    other way round: one machine works at a time. GPipe's pipeline cuts each mini-batch into M
    micro-batches: stage 2 works on micro-batch m while stage 1 already works on m + 1. The
    gradients of the M micro-batches add up, and one update per mini-batch applies their mean:
    exactly the update of M = 1 (the loss is a mean over equal micro-batches). What is left of
    the waiting, the bubble, is (K - 1) / (M + K - 1) of each stage's time for K stages.

The update rule (each step; K stages, M micro-batches of B/M examples)
    x_1 .. x_M <- split(next mini-batch, M)
    for m = 1..M:  h_m <- stage_K(... stage_1(x_m))   # stage k runs m after m-1, on its task;
                   L_m <- loss(h_m, y_m)              # stage k+1 of m overlaps stage k of m+1
    g          <- (grad L_1 + ... + grad L_M) / M     # each layer's gradient on its own task
    params     <- params - learning_rate * g          # once per mini-batch

Run it
    bash run.sh                      # 2 worker tasks: 2 stages; worker 0 is the client
    NUM_WORKERS=3 bash run.sh --micro_batches 8 --layers 6
    python train.py --devices 2      # alone: 2 stages on 2 devices of this process
    By hand, or with TF_CONFIG: as in ../In-Graph-Replication (worker 0 is the client).

Use your own model
    Edit the sections marked "(replace with your own)": Data, and Model (layers, each its
    variables and a function of the layer before). stage_of_each_layer gives each stage a run
    of whole layers, the largest stage as small as it can be. --batch_size must divide by
    --micro_batches.

References
    Y. Huang et al., "GPipe: Efficient Training of Giant Neural Networks using Pipeline
    Parallelism", NeurIPS 2019 (arXiv:1811.06965): micro-batches, the bubble, one synchronous
    update. J. Dean et al., "Large Scale Distributed Deep Networks", NIPS 2012 (model
    parallelism across machines).
"""
import argparse
import collections
import contextlib
import json
import os
import socket
import sys
import time

import numpy as np

tf = None  # loaded once the flags are checked: bad input fails in one line, at once
EXAMPLE = "Model-Parallel-Pipeline"
JOBS = ("worker",)  # worker 0 is the client, and drives every task; deploy/ and the tests read it


def example_flags(parser):
    parser.set_defaults(hidden=256)
    parser.add_argument("--layers", type=positive_int, default=5,
                        help="hidden layers of the MLP, each --hidden wide, split over the stages")
    parser.add_argument("--micro_batches", type=positive_int, default=4,
                        help="micro-batches each mini-batch is cut into (GPipe's M; 1: no "
                             "pipeline, one stage works at a time)")
    parser.add_argument("--devices", type=positive_int, default=1,
                        help="stages on each worker task (on this process, when it runs "
                             "alone): its GPUs if it has that many, else logical CPUs")
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
def layer_sizes(num_features, args, num_classes=10):
    """The widths from the input to the logits: --layers hidden layers of --hidden units."""
    return [num_features] + [args.hidden] * args.layers + [num_classes]


def layer_params(i, sizes, seed):
    """Layer i's variables, created under the current device scope (its stage's task)."""
    glorot = tf.compat.v1.glorot_uniform_initializer(seed=seed * 100 + i)
    return {"w": tf.compat.v1.get_variable("w%d" % i, sizes[i:i + 2], initializer=glorot),
            "b": tf.compat.v1.get_variable("b%d" % i, sizes[i + 1:i + 2],
                                           initializer=tf.compat.v1.zeros_initializer())}


def layer_forward(params, h, is_last):
    rows = tf.reshape(h, [-1, int(np.prod(h.shape[1:]))])  # an image becomes one row
    z = tf.matmul(rows, params["w"]) + params["b"]
    return z if is_last else tf.nn.relu(z)  # the last layer gives the logits


def model_loss(logits, y):
    """What training minimises: the mean cross-entropy over a (micro-)batch."""
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))


def model_metrics(logits, y):
    """What the client reports on the test set, by name: each a mean over a batch of examples."""
    correct = tf.equal(tf.argmax(logits, 1), y)
    return {"accuracy": tf.reduce_mean(tf.cast(correct, tf.float32))}


# --- The algorithm --------------------------------------------------------------------------------
Pipeline = collections.namedtuple("Pipeline", "layers stage_of global_step loss gradients step "
                                  "forward")


def stage_of_each_layer(sizes, stages):
    """The stage of every layer: consecutive layers to each stage, at least one each, and the
    largest stage's weights as few as whole layers allow (the slowest stage sets the pace).
    Needs at least as many layers as stages."""
    weights = [a * b for a, b in zip(sizes, sizes[1:])]
    best = {}  # (first layer, stages): the least largest stage of layers first.. on them

    def split(first, stages):  # (largest stage's weights, layers on each stage)
        if stages == 1:
            return sum(weights[first:]), [len(weights) - first]
        if (first, stages) not in best:
            options = []
            for count in range(1, len(weights) - first - stages + 2):  # leave one a stage
                largest, counts = split(first + count, stages - 1)
                options.append((max(sum(weights[first:first + count]), largest),
                                [count] + counts))
            best[first, stages] = min(options)
        return best[first, stages]
    counts = split(0, stages)[1]
    return [stage for stage, count in enumerate(counts) for _ in range(count)]


def build_pipeline(args, devices, x, y):
    """One synchronous step of the model split over devices (a stage each), on the mini-batch
    (x, y) cut into --micro_batches micro-batches. Returns the layers (their variables on their
    stage's device), the loss, the accumulated gradients and the update."""
    sizes = layer_sizes(int(np.prod(x.shape[1:])), args)
    stages, micro_batches = len(devices), args.micro_batches
    stage_of = stage_of_each_layer(sizes, stages)
    layers = []
    for i, stage in enumerate(stage_of):
        with tf.compat.v1.device(devices[stage]):  # each layer's variables on its stage
            layers.append(layer_params(i, sizes, args.seed))
    with tf.compat.v1.device(devices[0]):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        x_micro, y_micro = tf.split(x, micro_batches), tf.split(y, micro_batches)
    variables = [v for layer in layers for v in (layer["w"], layer["b"])]
    last_output = [None] * stages  # each stage's output for the micro-batch before
    losses, gradients = [], []
    for m in range(micro_batches):
        h = x_micro[m]
        for stage in range(stages):
            with tf.compat.v1.device(devices[stage]), \
                    tf.compat.v1.name_scope("stage%d/micro%d" % (stage, m)):
                # GPipe's order: a stage takes micro-batch m once it is done with m - 1. Nothing
                # ties it to the next stage, so stage k + 1 of m runs while stage k does m + 1
                with tf.control_dependencies([last_output[stage]] if m else []):
                    h = tf.identity(h)
                for i in (i for i, s in enumerate(stage_of) if s == stage):
                    h = layer_forward(layers[i], h, is_last=i == len(layers) - 1)
                last_output[stage] = h
        with tf.compat.v1.device(devices[-1]):
            losses.append(model_loss(h, y_micro[m]))
        # backward of micro-batch m: each op's gradient on the device of the op, its stage
        gradients.append(tf.gradients(losses[-1], variables))
    accumulated = []
    for v, g in zip(variables, zip(*gradients)):  # the mean of the micro-batches' gradients,
        with tf.compat.v1.device(v.device):       # summed where the variable lives
            accumulated.append(tf.add_n(list(g)) / micro_batches)
    with tf.compat.v1.device(devices[-1]):
        loss = tf.add_n(losses) / micro_batches
    update = tf.compat.v1.train.GradientDescentOptimizer(args.learning_rate).apply_gradients(
        zip(accumulated, variables), global_step=global_step)  # each variable on its device
    with tf.control_dependencies([update]):
        step = global_step.read_value()  # one update; its value: the global step after it

    def forward(x):  # the trained model on other data (the test set), stage after stage
        for i, layer in enumerate(layers):
            with tf.compat.v1.device(devices[stage_of[i]]):
                x = layer_forward(layer, x, is_last=i == len(layers) - 1)
        return x
    return Pipeline(layers, stage_of, global_step, loss, accumulated, step, forward)


class StageClock(object):
    """Each stage's busy fraction, measured apart from the algorithm: in a traced step, the
    time its device spent running ops (the union of their intervals; a stage waiting for a
    tensor from another is idle) over the step's length; the mean over the traced steps."""

    def __init__(self, devices):
        self.devices, self.busy, self.length = devices, [0] * len(devices), 0

    def run(self, session, fetches, traced):
        if not traced:
            return session.run(fetches)
        metadata = tf.compat.v1.RunMetadata()
        values = session.run(fetches, options=tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE), run_metadata=metadata)
        self.count(metadata.step_stats)
        return values

    def count(self, step_stats):
        """Add a traced step's busy time per stage, and its length."""
        spans_of_stage, every_span = [[] for _ in self.devices], []
        for device in step_stats.dev_stats:
            # a GPU's kernels are logged under .../device:GPU:0/stream:<n> (and stream:all)
            name = device.device.replace("/replica:0", "").split("/stream:")[0]
            stages = [s for s, d in enumerate(self.devices) if name.endswith(d)]
            for op in device.node_stats:
                span = (op.all_start_micros, op.all_start_micros + op.all_end_rel_micros)
                every_span.append(span)
                if stages and op.node_name != "RecvTensor":  # a tensor from another stage
                    spans_of_stage[stages[0]].append(span)  # is a wait, not work
        self.length += max(end for _, end in every_span) - min(s for s, _ in every_span)
        for stage, spans in enumerate(spans_of_stage):
            self.busy[stage] += covered(spans)

    def fractions(self):
        return [round(b / self.length, 3) if self.length else 0.0 for b in self.busy]


def covered(spans):
    """The length of the union of (start, end) intervals."""
    total, reached = 0, None
    for start, end in sorted(spans):
        if reached is None or start > reached:
            total, reached = total + end - start, end
        elif end > reached:
            total, reached = total + end - reached, end
    return total


# --- The training loop ----------------------------------------------------------------------------
# >>> shared: devices
def run_devices(args, cluster):
    """The devices that carry the model, in order: --devices of each worker task (or of this
    process alone), its GPUs if it has that many, else CPUs (task_config makes them); and the
    controller, the client's CPU, where the input pipeline goes."""
    kind = "GPU" if len(tf.config.list_physical_devices("GPU")) >= args.devices else "CPU"
    tasks = ["/job:worker/task:%d" % i for i in range(len(cluster["worker"]))] if cluster else [""]
    devices = ["%s/device:%s:%d" % (task, kind, d) for task in tasks for d in range(args.devices)]
    return devices, tasks[0] + "/device:CPU:0"


def task_config(args):
    """A task's devices, for its server and the client's session: --devices CPU devices (logical
    ones share the cores), and one thread per op, leaving cores to the other tasks."""
    return tf.compat.v1.ConfigProto(device_count={"CPU": args.devices},
                                    intra_op_parallelism_threads=1)
# <<< shared: devices


def train(args, cluster, target, data):
    """The client's loop: one graph, run on this process alone or on the cluster (target)."""
    devices, controller = run_devices(args, cluster)  # a stage on each device
    print("[%s] the model on %d device(s): %s" % (args.role, len(devices), " ".join(devices)),
          flush=True)
    with tf.compat.v1.device(controller):  # the input pipeline, at the first stage
        x, y = training_batches(data, args.batch_size, 0, 1, args.seed)
    pipeline = build_pipeline(args, devices, x, y)
    busy = StageClock(devices)
    with tf.compat.v1.device(controller):  # the test set's pipeline too (each layer: its stage)
        client = Client(args, cluster, pipeline.loss,
                        lambda x, y: model_metrics(pipeline.forward(x), y), data,
                        stages=len(devices), micro_batches=args.micro_batches,
                        stage_busy=busy.fractions)
    # TensorFlow's session for one client, as in ../In-Graph-Replication: no retries, the last
    # checkpoint in --log_dir restored or the variables initialised, checkpoints every 30 s
    config = task_config(args)
    config.operation_timeout_in_ms = int(args.step_timeout * 1000)  # a lost worker: an error
    session = tf.compat.v1.train.SingularMonitoredSession(hooks=[
        tf.compat.v1.train.StopAtStepHook(last_step=args.steps),
        tf.compat.v1.train.CheckpointSaverHook(args.log_dir, save_secs=30), client],
        master=target, config=config, checkpoint_dir=args.log_dir)
    while not session.should_stop():
        traced = (client.step + 1) % args.log_every == 0  # a step in --log_every is timed
        busy.run(session, pipeline.step, traced)
    # the hooks' end: the last checkpoint, the summary line. Not after an error: with a worker
    # lost, a session's close waits for ever (errors_in_one_line ends the process instead)
    session.close()
    return 0


def main(argv=None):
    global tf
    args = parse_flags(argv, example_flags)  # bad input fails here, before TensorFlow loads
    cluster = resolve_workers(args)  # {"worker": [host:port, ...]}, or TF_CONFIG's; None: alone
    stages = args.devices * (len(cluster["worker"]) if cluster else 1)
    if args.batch_size % args.micro_batches:
        fail("--batch_size %d cannot be cut into %d micro-batches: give a multiple of %d"
             % (args.batch_size, args.micro_batches, args.micro_batches))
    if stages > args.layers + 1:  # every stage needs a layer: --layers hidden, and the logits
        fail("%d stages for %d layers: give --layers %d or more"
             % (stages, args.layers + 1, stages - 1))
    data = load_dataset(args.data_path) if args.task_index == 0 else None  # the client's alone
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before the import: no C++ info lines
    import tensorflow as tf  # only now: bad input has failed in one line, before its start-up
    tf.compat.v1.disable_eager_execution()  # graphs and sessions: the tf.compat.v1 runtime
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)  # no deprecation notes
    with errors_in_one_line(args):  # a port in use, a lost worker: one line that says so
        if not cluster:
            return train(args, None, "", data)  # alone: the stages on this process's devices
        # the cluster and this task's server in it: worker 0's client builds the one graph, each
        # stage's variables and ops on its own task, and runs it on every worker's server
        server = tf.distribute.Server(tf.train.ClusterSpec(cluster), "worker", args.task_index,
                                      config=task_config(args))
        if args.task_index > 0:
            return serve(args, cluster, server)  # it runs what the graph places on it, no more
        return train(args, cluster, server.target, data)


# ==================================================================================================
# Plumbing shared by every example (what a job needs besides its algorithm)
# ==================================================================================================
# train() hands it what it built: nothing here knows the model or the algorithm. Each block is
# the same text in every train.py that uses it (a test compares them); this file's, in order:
# flags, tasks, npz, records, graph arrays, graph stream, graph test set, summary, one client.
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


# >>> shared: one client
def resolve_workers(args):
    """The workers from --worker_hosts, or else from TF_CONFIG, whose chief (or master) becomes
    worker 0; None if neither: this process runs alone. Sets role and address."""
    if not (args.worker_hosts or args.job_name or args.ps_hosts) and "TF_CONFIG" in os.environ:
        try:  # TF_CONFIG becomes the flags it stands for
            config = json.loads(os.environ["TF_CONFIG"])
            spec, task = config["cluster"], config["task"]
            chief = spec.get("chief", []) + spec.get("master", [])
            args.worker_hosts = ",".join(chief + spec.get("worker", []))
            args.job_name = "worker" if task["type"] in ("chief", "master") else task["type"]
            args.task_index = int(task.get("index") or 0) + (
                len(chief) if task["type"] == "worker" else 0)  # the workers after the chief
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            fail("TF_CONFIG is not valid cluster JSON (%s: %s)" % (type(e).__name__, e))
        if args.job_name == "evaluator":
            print("[evaluator] nothing to do: the client evaluates", flush=True)
            sys.exit(0)
        args.connect_timeout = args.connect_timeout or 600.0  # pods may start minutes apart
    if args.ps_hosts or args.job_name and not args.worker_hosts:
        fail("give --worker_hosts, and no --ps_hosts: this example has no parameter server")
    args.role = "worker%d" % args.task_index if args.worker_hosts else "local"
    if not args.worker_hosts:
        return None
    cluster = {"worker": args.worker_hosts.replace(" ", "").split(",")}
    args.job_name, args.connect_timeout = args.job_name or "worker", args.connect_timeout or 60.0
    check_cluster(cluster, args.job_name, args.task_index)
    args.address = cluster["worker"][args.task_index]
    return cluster


@contextlib.contextmanager
def errors_in_one_line(args):
    """A TensorFlow error that ends this task (its port taken, a worker lost) as one line."""
    try:
        yield
    except tf.errors.OpError as e:
        if "Could not start gRPC server" in e.message:  # gRPC could not bind the port
            fail("%s: port %s is already in use: by an earlier run, or another program?"
                 % (args.role, args.address))
        lost = isinstance(e, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError))
        why = "a worker is gone or did not answer within --step_timeout" if lost else cause(e)
        print("error: %s stopped: %s: %s" % (args.role, type(e).__name__, why), file=sys.stderr)
        os._exit(2)  # exit() would close the session, which waits for ever on a lost worker


def run_over_flag(index):
    """The flag the client raises at the end, on worker index: a local variable, one name in both
    graphs, which each session of the client sets up and no checkpoint holds."""
    with tf.compat.v1.device("/job:worker/task:%d" % index):
        return tf.compat.v1.get_local_variable("run_over_%d" % index, initializer=False)


def serve(args, cluster, server):
    """Serve the client's graph until it raises this worker's flag (a server never ends by
    itself); a flag that no client set up within --connect_timeout: an error."""
    with tf.Graph().as_default():
        run_over = run_over_flag(args.task_index)
        set_up = tf.compat.v1.is_variable_initialized(run_over)
        session = tf.compat.v1.Session(server.target, config=tf.compat.v1.ConfigProto(
            device_filters=["/job:worker/task:%d" % args.task_index]))  # no other to wait for
    print("[%s] serving %d device(s) for the client, worker 0 at %s"
          % (args.role, args.devices, cluster["worker"][0]), flush=True)
    if not wait_for(lambda: session.run(set_up), args.connect_timeout):
        fail("%s: no client set this worker up within %g s" % (args.role, args.connect_timeout))
    wait_for(lambda: session.run(run_over))
    print("[%s] the run is over; shutting down" % args.role, flush=True)
    return 0


class Client(object):
    """The client's SessionRunHook (each run one update): progress, TensorBoard, the summary."""

    def __init__(self, args, cluster, loss, test_metrics, data, **summary):
        self.args, self.loss, self.summary = args, loss, summary
        self.workers = cluster["worker"] if cluster else ["this process"]
        self.test_set = test_metrics_of(test_metrics, data)
        self.end_run = [run_over_flag(k).assign(True) for k in range(1, len(self.workers))]
        self.writer = tf.compat.v1.summary.FileWriterCache.get(args.log_dir)

    def begin(self):  # before the session starts: every other worker answers
        silent = lambda: [w for w in self.workers[1:] if not is_listening(w)]
        if not wait_for(lambda: not silent(), self.args.connect_timeout, waiting=lambda: (
                "[%s] waiting for the worker(s) at %s" % (self.args.role, ",".join(silent())))):
            fail("%s: no worker at %s: are they running?" % (self.args.role, ",".join(silent())))

    def after_create_session(self, session, coord):  # the data in an order of this session's
        self.step = self.start_step = int(session.run(tf.compat.v1.train.get_global_step()))
        self.started = time.time()
        start_the_data(session, self.step)
        print("[%s] training from global step %d: log_dir=%s"
              % (self.args.role, self.step, self.args.log_dir), flush=True)
        if self.step >= self.args.steps:
            coord.request_stop()  # (StopAtStepHook looks only after a step)

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self.loss)

    def after_run(self, run_context, run_values):  # every --log_every steps a progress line
        self.step, loss = self.step + 1, run_values.results
        if self.step % self.args.log_every == 0:
            metrics = self.evaluate(run_context.session, loss=loss)
            print("[%s] global_step=%d loss=%.4f%s" % (self.args.role, self.step, loss, "".join(
                " %s=%.4f" % metric for metric in metrics.items())), flush=True)

    def evaluate(self, session, **scalars):  # test_NAME over the test set, to TensorBoard too
        metrics = {"test_" + name: value
                   for name, value in mean_over_the_test_set(session, *self.test_set).items()}
        self.writer.add_summary(tf.compat.v1.Summary(value=[
            tf.compat.v1.Summary.Value(tag=tag, simple_value=value)
            for tag, value in dict(metrics, **scalars).items()]), self.step)
        return metrics

    def end(self, session):  # after CheckpointSaverHook's last save; then the run is over
        updates, seconds = self.step - self.start_step, time.time() - self.started
        summary = dict(example=EXAMPLE, **self.evaluate(session))  # (after the clock stopped)
        summary.update(global_step=self.step, workers=len(self.workers), ps=0, lost_workers=0,
                       local_steps=[updates], updates=updates, steps_per_sec=updates / seconds)
        summary.update({key: v() if callable(v) else v for key, v in self.summary.items()})
        print_summary(self.args.role, summary)
        self.writer.flush()
        session.run(self.end_run)
# <<< shared: one client


if __name__ == "__main__":
    sys.exit(main())

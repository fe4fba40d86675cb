"""ParameterServerStrategy: TensorFlow 2's parameter-server training, driven by a coordinator.

What it teaches
    The same asynchronous training as ../Distributed-Setup, written the TensorFlow 2 way. The
    workers and parameter servers only run servers; one more process, the coordinator (the
    "chief"), holds the program. It creates the variables on the ps under strategy.scope(),
    gives each worker a dataset of its own (a per-worker dataset), and schedules a
    tf.function that runs K steps on whichever worker is free; the worker reads the parameters
    from the ps and writes its updates back; no worker waits for another. A lost worker costs
    only its running call, which is scheduled again elsewhere. Several ps shard large variables.

The update rule (asynchronous SGD; the global step counts mini-batches)
    the coordinator, until --steps mini-batches are scheduled:
        schedule train_steps on a free worker
    train_steps, on a worker (K = --steps_per_call):
        K times:  g <- grad L(params; next mini-batch of this worker's dataset)
                  params <- params - learning_rate * g          # on the ps
                  global_step <- global_step + 1
    A worker with several GPUs runs a mini-batch on each (its replicas) and g is the mean of
    their gradients: one step of learning_rate, not one per replica.

Run it
    bash run.sh                                    # 1 ps + 2 workers + the coordinator
    NUM_PS=2 bash run.sh --steps_per_call 20       # w1 in two shards, one on each ps
    By hand: every task gets --ps_hosts, --worker_hosts, --chief_host and its --job_name (ps,
    worker or chief) and --task_index; or TF_CONFIG with "chief", "worker" and "ps" jobs.

Use your own model: replace the sections marked "(replace with your own)", Data and Model.

References
    TensorFlow guide "Parameter server training with ParameterServerStrategy";
    tf.distribute.ParameterServerStrategy, tf.distribute.coordinator.ClusterCoordinator.
    B. Recht et al., "Hogwild!", NIPS 2011 (lock-free asynchronous updates).
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
EXAMPLE = "ParameterServerStrategy"
JOBS = ("chief", "worker", "ps")  # the jobs of its cluster; deploy/ and the tests read them here


def example_flags(parser):
    parser.add_argument("--chief_host", default="", help="host:port of the coordinator")
    parser.add_argument("--steps_per_call", type=positive_int, default=10,
                        help="K: mini-batch steps inside one scheduled function")


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
Pss = collections.namedtuple("Pss", "strategy coordinator params global_step steps_per_worker "
                             "per_worker_batches train_steps")


def build_pss(args, cluster, data):
    """The strategy, the variables on the ps, each worker's dataset, and the scheduled step."""
    workers = len(cluster["worker"])
    with bounded_start(args, cluster):  # it waits for every task: here --connect_timeout at most
        strategy = tf.distribute.ParameterServerStrategy(  # it reads the cluster from TF_CONFIG
            tf.distribute.cluster_resolver.TFConfigClusterResolver(),
            variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
                min_shard_bytes=4096, max_shards=len(cluster["ps"])))  # over 4 KiB: a shard a ps
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    example_shape = data.shape if isinstance(data, Records) else data.x_train.shape[1:]
    with strategy.scope():  # every variable made here lives on the ps
        params = model_params(example_shape, args.hidden, args.seed, data.num_classes)
        global_step = tf.Variable(0, dtype=tf.int64, name="global_step")
        steps_per_worker = tf.Variable(tf.zeros([workers], tf.int64), name="steps_per_worker")
    shards = [v for p in params.values() for v in getattr(p, "variables", [p])]

    def dataset_fn():  # runs on each worker as it makes its dataset (again after a restart)
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        # its own shard, in an order of its own that the global step then mixes in: a resumed
        # run, or a restarted worker, does not replay the mini-batches the run began with
        seed = (args.seed * 1000 + tf.cast(worker, tf.int64)) * 1000003 + global_step
        return training_dataset(data, args.batch_size, worker, workers, seed)
    per_worker_batches = lambda: iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def train_steps(iterator):  # K steps on one worker, scheduled by the coordinator
        def gradients(x, y):  # on each replica of the worker: each of its GPUs, or its CPU
            with tf.GradientTape() as tape:
                loss = model_loss(params, x, y)
            return loss, tape.gradient(loss, shards)
        loss = tf.constant(0.0)
        for _ in tf.range(args.steps_per_call):
            losses, per_replica = strategy.run(gradients, args=next(iterator))
            # one step a mini-batch per replica: the mean over a worker's replicas, applied
            # once (applying each replica's gradient would multiply the rate by their number)
            for v, g in zip(shards, per_replica):
                v.assign_sub(args.learning_rate * strategy.reduce("MEAN", g, axis=None))
            global_step.assign_add(1)  # on the ps, unordered with the other workers' steps
            loss = strategy.reduce("MEAN", losses, axis=None)
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        steps_per_worker.scatter_add(tf.IndexedSlices(  # the mini-batches of each worker's shard
            tf.constant([args.steps_per_call], tf.int64), tf.reshape(worker, [1])))
        return loss
    return Pss(strategy, coordinator, params, global_step, steps_per_worker, per_worker_batches,
               train_steps)


# --- The training loop ----------------------------------------------------------------------------
def train(args, cluster, data):
    """Schedule until --steps mini-batches, evaluating on the way; then the summary line."""
    pss = build_pss(args, cluster, data)
    run, local_steps = schedule_until_done(args, cluster, pss, lambda: test_batches(data),
                                           lambda x, y: model_metrics(pss.params, x, y))
    return run.end(local_steps, lost_workers=sum(not is_listening(a) for a in cluster["worker"]),
                   steps_per_call=args.steps_per_call)


# >>> shared: coordinator
def schedule_until_done(args, cluster, pss, test_set, test_metrics):
    """The coordinator's loop: the latest checkpoint in --log_dir restored, then calls of
    pss.train_steps scheduled until --steps mini-batches, with a progress line (the test
    metrics) and a checkpoint every --log_every; returns the run and the mini-batches each
    worker's shard gave, once every scheduled call has run, and the last checkpoint saved."""
    for name, p in pss.params.items():  # where the variables live (in slices, if partitioned)
        print("[chief0] %s %s on %s" % (name, p.shape.as_list(), ", ".join(
            v.device.split("/device")[0] for v in getattr(p, "variables", [p]))), flush=True)
    checkpoints = tf.train.CheckpointManager(tf.train.Checkpoint(
        global_step=pss.global_step, steps_per_worker=pss.steps_per_worker, **pss.params),
        args.log_dir, max_to_keep=3)
    if checkpoints.restore_or_initialize():  # a rerun with the same --log_dir resumes
        print("[chief0] resuming from the checkpoint at global step %d" % pss.global_step.numpy(),
              flush=True)
    run = TrainingRun(args, cluster, pss.global_step, test_metrics, test_set)
    iterator = pss.per_worker_batches()  # each worker makes its dataset now, at this step
    calls = math.ceil((args.steps - run.start_step) / args.steps_per_call)  # none if done
    every = max(1, args.log_every // args.steps_per_call)  # calls between progress lines
    threading.Thread(target=end_when_no_worker_answers, args=(args, cluster), daemon=True).start()
    for call in range(1, max(calls, 0) + 1):
        loss = pss.coordinator.schedule(pss.train_steps, args=(iterator,))
        if call == 1:  # traced, sent and run once: the clock starts
            loss.fetch()
            run.start_clock()
        if call % every == 0:  # every call so far has run: the line's step is exact
            pss.coordinator.join()  # (a call on another worker may still be running)
            run.progress(float(loss.fetch()))
            checkpoints.save(checkpoint_number=pss.global_step)
    pss.coordinator.join()  # every scheduled call has run (again elsewhere, if a worker died)
    checkpoints.save(checkpoint_number=pss.global_step)
    return run, [int(s) for s in pss.steps_per_worker.numpy()]


def end_when_no_worker_answers(args, cluster):
    """The coordinator waits up to an hour for a lost worker to come back: with none left for
    --connect_timeout seconds, end the run in one line instead."""
    silent_since = None
    while True:
        if any(is_listening(address) for address in cluster["worker"]):
            silent_since = None
        elif silent_since is None:
            silent_since = time.time()
        elif time.time() - silent_since > args.connect_timeout:
            print("error: chief 0 stopped: no worker has answered for %.0f s" % (
                args.connect_timeout), file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(2)
        time.sleep(1)  # the pace of the checks


def run_pss_task(args, cluster, train, data):
    """This task of a ParameterServerStrategy cluster: the chief coordinates (train), a ps or a
    worker only serves until the coordinator is gone."""
    os.environ["GRPC_FAIL_FAST"] = "use_caller"  # a lost worker fails fast; its work moves on
    if args.job_name != "chief":
        return run_task(args, serve_until_gone, args, cluster, cluster["chief"][0])
    return run_task(args, train, args, cluster, data)
# <<< shared: coordinator


def main(argv=None):
    args = parse_flags(argv, example_flags)  # bad input fails here, before TensorFlow loads
    cluster = tf2_cluster(args, JOBS)  # {"chief": [host:port], "worker": [...], "ps": [...]}
    data = load_dataset(args.data_path) if args.job_name == "chief" else None  # it sends it
    return run_pss_task(args, cluster, train, data)


# ==================================================================================================
# Plumbing shared by every example (what a job needs besides its algorithm)
# ==================================================================================================
# Each block is one text in every train.py that has it (a test checks); this file's, in order:
# flags, tasks, npz, records, summary, tf2 cluster, tf2 coordinated, tf2 data, tf2 run.
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


# >>> shared: summary
def print_summary(role, summary):
    """The run's last line, key=value ...: what users, the tests and the benchmarks read."""
    text = lambda v: (",".join(map(str, v)) if isinstance(v, list)
                      else "%.6g" % v if isinstance(v, float) else str(v))
    print("[%s] summary %s" % (role, " ".join("%s=%s" % (k, text(v)) for k, v in summary.items())),
          flush=True)
# <<< shared: summary


# >>> shared: tf2 cluster
def tf2_cluster(args, jobs):
    """The cluster of jobs (its JOBS) from the flags, or else TF_CONFIG, written to TF_CONFIG for
    the strategies. Sets job_name, task_index, address, connect_timeout (600 s under TF_CONFIG)."""
    given = dict(chief=getattr(args, "chief_host", ""), worker=args.worker_hosts, ps=args.ps_hosts)
    job, index = args.job_name, args.task_index
    from_flags = job or any(given.values()) or "TF_CONFIG" not in os.environ
    if args.connect_timeout is None:  # a cluster's pods may start minutes apart
        args.connect_timeout = 60.0 if from_flags else 600.0
    if from_flags:
        if not all(given[name] for name in jobs):
            fail("give %s (or set TF_CONFIG)" % " and ".join("--" + (
                "chief_host" if name == "chief" else name + "_hosts") for name in jobs))
        cluster = {name: given[name].replace(" ", "").split(",") for name in jobs}
    else:
        try:
            config = json.loads(os.environ["TF_CONFIG"])
            spec, job = dict(config["cluster"]), config["task"]["type"]
            index = int(config["task"].get("index") or 0)
            chief = [] if "chief" in jobs else list(spec.pop("chief", []))  # then: worker 0
            spec["worker"] = chief + list(spec.get("worker", []))
            if chief and job in ("chief", "worker"):
                job, index = "worker", 0 if job == "chief" else index + len(chief)
            cluster = {name: list(spec[name]) for name in jobs}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            fail("TF_CONFIG is not valid cluster JSON for %s (%s: %s)"
                 % ("/".join(jobs), type(e).__name__, e))
        if job == "evaluator":
            fail("an evaluator task is not needed here: the %s evaluates; remove it from TF_CONFIG"
                 % ("chief" if "chief" in jobs else "worker 0"))
    check_cluster(cluster, job, index)
    os.environ["TF_CONFIG"] = json.dumps(dict(cluster=cluster, task=dict(type=job, index=index)))
    args.job_name, args.task_index, args.address = job, index, cluster[job][index]
    return cluster


def run_task(args, task, *task_args):
    """Load TensorFlow (bad input has failed before its start-up), run task(*task_args), and exit
    at once (the strategy's threads would keep an exit waiting); an error that ends it: one line."""
    global tf
    if os.environ.get("VERBOSE") != "1":  # before the import: TensorFlow's C++ log reports
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # every peer that leaves as an error
    import tensorflow as tf
    try:
        code = task(*task_args)
    except SystemExit as stop:  # fail() has said why
        code = stop.code
    except tf.errors.OpError as e:
        why = "%s: %s" % (type(e).__name__, cause(e))
        if "Could not start gRPC server" in e.message:  # gRPC could not bind the port
            why = "port %s is already in use: by an earlier run, or another program?" % args.address
        elif isinstance(e, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)):
            why = "%s: a peer is gone or did not answer in time" % type(e).__name__
        print("error: %s %d stopped: %s" % (args.job_name, args.task_index, why),
              file=sys.stderr, flush=True)
        code = 2
    os._exit(code)  # (every line of ours was flushed)
# <<< shared: tf2 cluster


# >>> shared: tf2 coordinated
@contextlib.contextmanager
def bounded_start(args, cluster):
    """Around ParameterServerStrategy's start, which waits for every task of the cluster without
    a bound: with no start after --connect_timeout, one line that names the silent, and exit."""
    started = threading.Event()

    def watch():
        if not wait_for(started.is_set, args.connect_timeout):
            silent = [a for hosts in cluster.values() for a in hosts if not is_listening(a)]
            print("error: %s %d stopped: the cluster has not started within %g s; silent: %s" % (
                args.job_name, args.task_index, args.connect_timeout, ",".join(silent) or "none"),
                file=sys.stderr, flush=True)
            os._exit(2)
    threading.Thread(target=watch, daemon=True).start()
    yield
    started.set()


def serve_until_gone(args, cluster, watched):
    """A task with nothing of its own to run (a ps; a worker the coordinator drives) serves until
    the task at watched has come and gone (a server never stops; its join() ignores SIGTERM): its
    port refuses a connection, or leaves them unanswered for --connect_timeout (a host that is
    down never answers; a slow link late: at 20 Mbit/s the coordinator's start-up did)."""
    role = "%s%d" % (args.job_name, args.task_index)
    tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=args.job_name,
                         task_index=args.task_index, protocol="grpc", start=True)
    print("[%s] serving at %s until %s is done" % (role, args.address, watched), flush=True)
    if not wait_for(lambda: is_listening(watched), args.connect_timeout):
        fail("%s: %s did not come up within %.0f s" % (role, watched, args.connect_timeout))
    answered = time.time()
    while time.time() < answered + args.connect_timeout:
        try:
            socket.create_connection(watched.rsplit(":", 1), timeout=1).close()
            answered = time.time()
        except ConnectionRefusedError:
            break
        except OSError:  # no answer within the second, or no route for now
            pass
        time.sleep(0.25)  # the pace of the checks
    print("[%s] %s is gone; shutting down" % (role, watched), flush=True)
    return 0
# <<< shared: tf2 coordinated


# >>> shared: tf2 data
ARRAYS_IN_A_GRAPH_MB = 256  # a traced dataset function's arrays at most (see arrays_dataset)


def arrays_dataset(x, y, worker_index, num_workers, seed, scale=1.0):
    """This worker's shard of the arrays (x, y), example by example, in a new order every epoch,
    integer pixels divided by scale after the shuffle. Traced (ParameterServerStrategy's dataset
    function), they are a constant of a graph every worker holds (a GraphDef: 2 GB at most)."""
    size = (x.nbytes + y.nbytes) / 2**20
    if not tf.executing_eagerly() and size > ARRAYS_IN_A_GRAPH_MB:
        fail("%.0f MB of training arrays would be a constant of the traced dataset function, on "
             "every worker (at most %d MB): write them as TFRecord files (python tools/npz_to_tf"
             "record.py DATA.npz FOLDER) and give --data_path FOLDER"
             % (size, ARRAYS_IN_A_GRAPH_MB))
    examples = tf.data.Dataset.from_tensor_slices((x, y)).shard(num_workers, worker_index)
    examples = examples.shuffle(len(x) // num_workers + 1, seed=seed)  # the shards differ
    if x.dtype == np.float32:
        return examples
    return examples.map(lambda xs, ys: (tf.cast(xs, tf.float32) / scale, ys))


def test_batches(data, size=1000):
    """The test set, size examples a batch, x in float32 scaled as in training: streamed from
    the TFRecord files (never all in memory), or sliced from the arrays."""
    if isinstance(data, Records):
        return iter(data.test_batches(size))
    return ((tf.cast(data.x_test[i:i + size], tf.float32) / getattr(data, "x_scale", 1.0),
             data.y_test[i:i + size]) for i in range(0, len(data.x_test), size))
# <<< shared: tf2 data


# >>> shared: tf2 run
class TrainingRun(object):
    """The progress lines, and the chief's test metrics (to TensorBoard too, with the loss) and
    summary line. train() hands it the global step (a variable), test_metrics(x, y) (means over
    a batch, by name), test_set() (the batches (x, y)) and the mini-batches a step trains."""

    def __init__(self, args, cluster, global_step, test_metrics, test_set, is_chief=True,
                 minibatches_per_step=1):
        self.cluster, self.global_step, self.is_chief = cluster, global_step, is_chief
        self.test_metrics, self.test_set = test_metrics, test_set
        self.role, self.per_step = "%s%d" % (args.job_name, args.task_index), minibatches_per_step
        self.writer = tf.summary.create_file_writer(args.log_dir) if is_chief else None
        self.start_step = int(global_step.numpy())
        self.start_clock()  # again once the first step has returned: its tracing untimed
        print("[%s] training started: log_dir=%s" % (self.role, args.log_dir), flush=True)

    def start_clock(self):
        self.clock = self.last_line = (int(self.global_step.numpy()), time.time())

    def pace(self, since):  # the global step, and the mini-batches a second since (step, time)
        step = int(self.global_step.numpy())
        return step, (step - since[0]) * self.per_step / (time.time() - since[1])

    def evaluate(self, step, loss=None):
        """The test metrics, each a mean over every test example, by name; to TensorBoard."""
        totals, examples = collections.Counter(), 0
        for x, y in self.test_set():
            totals.update({name: float(v) * len(y) for name, v in self.test_metrics(x, y).items()})
            examples += len(y)
        metrics = {"test_" + name: total / examples for name, total in totals.items()}
        with self.writer.as_default(step=step):
            for tag, v in list(metrics.items()) + ([("loss", loss)] if loss is not None else []):
                tf.summary.scalar(tag, v)
        return metrics

    def progress(self, loss):  # the global step, the loss, the chief's test metrics, the pace
        step, rate = self.pace(self.last_line)
        metrics = self.evaluate(step, loss) if self.is_chief else {}
        print("[%s] global_step=%d loss=%.4f%s steps_per_sec=%.1f" % (self.role, step, loss,
              "".join(" %s=%.4f" % metric for metric in metrics.items()), rate), flush=True)
        self.last_line = (step, time.time())

    def end(self, local_steps, lost_workers=0, **extra):
        """The chief's summary line; local_steps: each worker's mini-batches (its shard's)."""
        if self.is_chief:
            step, rate = self.pace(self.clock)
            print_summary(self.role, dict(
                example=EXAMPLE, **self.evaluate(step), global_step=step,
                workers=len(self.cluster["worker"]), ps=len(self.cluster.get("ps", [])),
                lost_workers=lost_workers, local_steps=local_steps,
                updates=step - self.start_step, steps_per_sec=rate, **extra))
            self.writer.close()
        return 0
# <<< shared: tf2 run


if __name__ == "__main__":
    sys.exit(main())

"""Keras-Fit: a tf_keras model trained by model.fit on a cluster, under ParameterServerStrategy
or MultiWorkerMirroredStrategy.

What it teaches
    The way most TensorFlow users train, distributed: a compiled Keras model and model.fit,
    with the strategy chosen by one flag. The model is built and compiled under
    strategy.scope(), so its variables are the strategy's (on the ps, or a copy on every
    worker); the training set comes from a dataset function that each worker calls for its own
    shard (wrapped in a DatasetCreator); and callbacks do the rest: BackupAndRestore backs the
    run up and resumes it, TensorBoard writes the curves, and a callback of this file prints
    the progress lines with the chief's test metrics. At the end the model is saved in Keras'
    own format (model.keras), which tf_keras.models.load_model reads in any process.

The update rule (the same as the custom loops beside it: ../ParameterServerStrategy and
../MultiWorkerMirroredStrategy; K = --steps_per_execution)
    parameter_server (default): the coordinator (the chief) runs model.fit, which schedules
        train_function on whichever worker is free; on that worker, K times:
            g <- grad L(params; next mini-batch of this worker's shard)
            params <- params - learning_rate * g                        # on the ps
        (asynchronous: no worker waits for another; optimizer.iterations counts mini-batches)
    multi_worker_mirrored: every worker runs model.fit; each step, on each of the N replicas:
            g_k <- grad L(params; next mini-batch of k)
            params <- params - N * learning_rate * all-reduce mean(g_1 .. g_N)  # every copy
        (synchronous; optimizer.iterations counts steps of N mini-batches; the rate is scaled
        by N, the linear scaling rule, as in ../MultiWorkerMirroredStrategy)
    The dataset repeats for ever, so Keras needs an epoch's length: --backup_every steps, as
    BackupAndRestore backs up at an epoch's end. The run's place is the global step
    (optimizer.iterations): a rerun goes on from the backup's to --steps, wherever it stopped.

Run it
    bash run.sh                                         # a coordinator, 1 ps and 2 workers
    bash run.sh --strategy multi_worker_mirrored        # 2 workers, no ps
    By hand: every task gets --strategy, --worker_hosts, and for parameter_server --ps_hosts
    and --chief_host, its --job_name (chief, worker or ps) and --task_index; or TF_CONFIG.
    Start again with the same --log_dir and the run resumes from its backup.

Use your own model: replace build_model (any tf_keras model, compiled there: it runs under
strategy.scope()) and model_metrics (what the chief reports on the test set); the data comes
from --data_path, or replace the Data section.

References
    TensorFlow tutorials "Parameter server training with ParameterServerStrategy" (model.fit
    with a DatasetCreator) and "Multi-worker training with Keras" (model.fit with
    BackupAndRestore); tf_keras.Model.fit, tf_keras.callbacks.BackupAndRestore.
    P. Goyal et al., "Accurate, Large Minibatch SGD", arXiv:1706.02677 (the linear scaling
    rule).
"""
import argparse
import collections
import contextlib
import json
import math
import os
import shutil
import socket
import sys
import tempfile
import threading
import time

import numpy as np

tf = None  # loaded once the flags are checked: bad input fails in one line, at once
keras = None  # tf_keras, loaded with TensorFlow: the Keras whose model.fit runs on a cluster
EXAMPLE = "Keras-Fit"
JOBS = ("chief", "worker", "ps")  # the default strategy's jobs; deploy/ and the tests read them
STRATEGY_JOBS = {"parameter_server": JOBS, "multi_worker_mirrored": ("worker",)}


def example_flags(parser):
    parser.add_argument("--strategy", choices=sorted(STRATEGY_JOBS), default="parameter_server",
                        help="how model.fit is distributed")
    parser.add_argument("--chief_host", default="", help="host:port of the coordinator "
                        "(parameter_server)")
    parser.add_argument("--steps_per_execution", type=positive_int, default=10,
                        help="K: mini-batch steps in one call of the training function")
    parser.add_argument("--backup_every", type=positive_int, default=500,
                        help="back up every N steps, and at the end: fit's epoch is N steps "
                        "(BackupAndRestore backs up at an epoch's end)")
    parser.add_argument("--step_timeout", type=positive_float, default=20,
                        help="multi_worker_mirrored: seconds a collective may wait for the "
                        "other workers")


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
def build_model(input_shape, num_classes, hidden, seed, learning_rate, steps_per_execution):
    """The compiled tf_keras model (called under strategy.scope(): its variables, and the
    optimizer's, are the strategy's). An MLP: each example read as one row, a ReLU layer of
    hidden units, a logit per class; plain SGD on the mean cross-entropy."""
    glorot = lambda i: keras.initializers.GlorotUniform(seed=seed * 10 + i)
    model = keras.Sequential([
        keras.Input(shape=input_shape),
        keras.layers.Flatten(),  # an image becomes one row
        keras.layers.Dense(hidden, activation="relu", kernel_initializer=glorot(1)),
        keras.layers.Dense(num_classes, kernel_initializer=glorot(2))])
    # no training metrics (metrics=[...]): under ParameterServerStrategy each is a variable on
    # the ps, updated every step (measured: 10-20% of the pace); the chief's are model_metrics
    model.compile(optimizer=keras.optimizers.SGD(learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=steps_per_execution)
    return model


def model_metrics(model, x, y):
    """What the chief reports on the test set, by name: each a mean over a batch of examples."""
    correct = tf.equal(tf.argmax(model(x, training=False), 1), y)
    return {"accuracy": tf.reduce_mean(tf.cast(correct, tf.float32))}


# --- The algorithm --------------------------------------------------------------------------------
Fit = collections.namedtuple("Fit", "strategy model inputs steps_per_worker minibatches_per_step")


def build_fit(args, cluster, data):
    """The strategy, the model made under its scope, and the dataset function's DatasetCreator:
    what model.fit needs to train on the cluster."""
    workers, coordinated = len(cluster["worker"]), args.strategy == "parameter_server"
    if coordinated:  # both strategies read the cluster from TF_CONFIG
        with bounded_start(args, cluster):  # it waits for every task: here --connect_timeout
            strategy = tf.distribute.ParameterServerStrategy(
                tf.distribute.cluster_resolver.TFConfigClusterResolver(),
                variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
                    min_shard_bytes=4096, max_shards=len(cluster["ps"])))  # a shard per ps
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                timeout_seconds=args.step_timeout))
    replicas = strategy.num_replicas_in_sync  # mirrored: a mini-batch each in every step
    example_shape = data.shape if isinstance(data, Records) else data.x_train.shape[1:]
    with strategy.scope():  # the variables: on the ps, or a copy on every worker
        model = build_model(example_shape, data.num_classes, args.hidden, args.seed,
                            args.learning_rate * (1 if coordinated else replicas),
                            args.steps_per_execution)
        steps_per_worker = tf.Variable(tf.zeros([workers], tf.int64), name="steps_per_worker")

    def dataset_fn(context):  # on each worker as it makes its dataset: its own part of the data
        if coordinated:  # every worker's context says pipeline 0 of 1 (and after a restart too)
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        else:  # pipeline i of N: worker i's
            worker = context.input_pipeline_id
        tf.print(tf.strings.format("[worker{}] training on shard {} of {}", (
            worker, worker, workers)))  # printed by the worker, each time it makes its dataset
        # in an order of its own that the global step mixes in: no replay after a resume
        seed = (args.seed * 1000 + tf.cast(worker, tf.int64)) * 1000003 + model.optimizer.iterations
        return training_dataset(data, args.batch_size, worker, workers, seed)
    if coordinated:
        count_each_workers_steps(model, steps_per_worker)
    return Fit(strategy, model, keras.utils.experimental.DatasetCreator(dataset_fn),
               steps_per_worker, 1 if coordinated else replicas)


def count_each_workers_steps(model, steps_per_worker):
    """Under ParameterServerStrategy each step also counts a mini-batch of the worker that runs
    it (the coordinator does not know where a call ran): its shard's, on the ps."""
    train_step = model.train_step  # what a step does in tf_keras: fit traces it on the workers

    def counted(data):
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        steps_per_worker.scatter_add(tf.IndexedSlices(tf.constant([1], tf.int64),
                                                      tf.reshape(worker, [1])))
        return train_step(data)
    model.train_step = counted


# --- The training loop ----------------------------------------------------------------------------
def train(args, cluster, data):
    """model.fit with the callbacks a run needs; then the model saved and the summary line."""
    global keras
    import tf_keras as keras  # not tf.keras: Keras 3's model.fit has no path for these strategies
    fit = build_fit(args, cluster, data)
    is_chief = args.job_name == "chief" or args.task_index == 0  # the coordinator, or worker 0
    backup = os.path.join(args.log_dir, "backup")
    restore_the_backup(args, backup, fit.model)
    run = TrainingRun(args, cluster, fit.model.optimizer.iterations, lambda x, y: model_metrics(
        fit.model, x, y), lambda: test_batches(data), is_chief, fit.minibatches_per_step)
    last_step = math.ceil(args.steps / fit.minibatches_per_step)  # --steps counts mini-batches
    if run.start_step < last_step:
        try:  # an epoch of --backup_every steps: BackupAndRestore backs up at an epoch's end
            fit.model.fit(fit.inputs, steps_per_epoch=args.backup_every, epochs=math.ceil(
                (last_step - run.start_step) / args.backup_every), verbose=0, callbacks=[
                    backup_and_restore(backup),  # a rerun resumes from its backup
                    keras.callbacks.TensorBoard(args.log_dir, write_graph=False),
                    progress_callback(args, run, last_step)])
        except tf.errors.UnavailableError:
            end_if_a_ps_is_lost(args, cluster)  # a ps cannot come back: say so, and how to resume
            raise
    save_model(args, fit.model, is_chief)
    step = int(fit.model.optimizer.iterations.numpy())
    extra = dict(lost_workers=sum(not is_listening(a) for a in cluster["worker"]),
                 local_steps=[int(s) for s in fit.steps_per_worker.numpy()])
    if args.strategy != "parameter_server":  # every worker in every step, N mini-batches each
        extra = dict(local_steps=[step - run.start_step] * len(cluster["worker"]),
                     learning_rate_eff=args.learning_rate * fit.minibatches_per_step)
    return run.end(strategy=args.strategy, steps_per_execution=args.steps_per_execution,
                   mini_batches=(step - run.start_step) * fit.minibatches_per_step, **extra)


def restore_the_backup(args, backup, model):
    """The model (and the global step, its optimizer's) as the last backup in backup left it.
    BackupAndRestore restores it too, but only once fit has made each worker's dataset, whose
    order mixes in the global step it starts from."""
    latest = tf.train.latest_checkpoint(os.path.join(backup, "chief"))  # the chief's backups
    if latest:
        tf.train.Checkpoint(model=model).restore(latest).expect_partial()
        print("[%s%d] resuming from the backup at global step %d" % (
            args.job_name, args.task_index, model.optimizer.iterations.numpy()), flush=True)


def backup_and_restore(backup):
    """tf_keras's BackupAndRestore in backup, at every epoch's end and kept at the end
    (delete_checkpoint=False), with one correction: it restores fit's epoch too, and a rerun
    would skip on to the epoch after the one backed up, also when that ended early at --steps.
    Here fit's epochs count from 0 again, and progress_callback counts the run's steps on from
    the global step restored."""
    class FromTheGlobalStep(keras.callbacks.BackupAndRestore):
        def on_train_begin(self, logs=None):
            super().on_train_begin(logs)  # the restore
            self._training_state._ckpt_saved_epoch.assign(-1)  # "none backed up yet"
    return FromTheGlobalStep(backup, delete_checkpoint=False)


def save_model(args, model, is_chief):
    """The model in Keras' own format, log_dir/model.keras. Under MultiWorkerMirroredStrategy
    every worker saves (reading a metric's variable is an all-reduce); only the chief's file
    is kept."""
    path = os.path.join(args.log_dir, "model.keras")
    if not is_chief:
        scratch = tempfile.mkdtemp(prefix="model-scratch-")
        model.save(os.path.join(scratch, "model.keras"))
        shutil.rmtree(scratch, ignore_errors=True)
        return
    model.save(path)
    print("[%s%d] saved the model: %s" % (args.job_name, args.task_index, path), flush=True)


def end_if_a_ps_is_lost(args, cluster):
    """The run ends in one line when a ps is gone: its variables went with it, and TensorFlow
    does not recover a lost ps. The backup in --log_dir is where a rerun resumes."""
    lost = [str(i) for i, address in enumerate(cluster.get("ps", [])) if not is_listening(address)]
    if lost:
        print("error: chief 0 stopped: ps %s is gone, and the variables on it (TensorFlow "
              "cannot recover a lost ps); start the run again with --log_dir %s to resume from "
              "its last backup" % (",".join(lost), args.log_dir), file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(2)  # the coordinator's threads would keep an ordinary exit waiting


def progress_callback(args, run, last_step):
    """A tf_keras Callback (its class made here, once TensorFlow has loaded): a progress line
    every --log_every steps (the chief's with the test metrics), and fit stopped at last_step
    (model.stop_training), counted from the global step the run started at: fit's epochs and
    batches count from 0. Its lines come from the batch hook, not the epoch's end: under
    ParameterServerStrategy an epoch's end waits for every scheduled call, and the workers
    would idle while the chief evaluates; here it waits for the one call whose loss it reads."""
    class Progress(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            # the logs a batch hook gets stay as fit made them (a RemoteValue under
            # ParameterServerStrategy), or Keras would wait for every call to read them
            self._supports_tf_logs = True
            self.reached = run.start_step  # the steps scheduled: the global step once they ran

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch_starts = self.reached

        def on_train_batch_end(self, batch, logs=None):  # batch: the call's last step
            before, self.reached = self.reached, self.epoch_starts + batch + 1
            if before == run.start_step:  # the first call traced, sent and run: the clock starts
                returned(logs)
                run.start_clock()
            if self.reached // args.log_every > before // args.log_every:
                run.progress(float(returned(logs)["loss"]))
            if self.reached >= last_step:
                self.model.stop_training = True
    return Progress()


def returned(logs):
    """A call's logs once it has returned: a RemoteValue's (ParameterServerStrategy) fetched,
    tensors read."""
    if hasattr(logs, "fetch"):
        return logs.fetch()
    return tf.nest.map_structure(np.asarray, logs)


def main(argv=None):
    args = parse_flags(argv, example_flags)  # bad input fails here, before TensorFlow loads
    cluster = tf2_cluster(args, STRATEGY_JOBS[args.strategy])
    if args.strategy == "parameter_server":
        os.environ["GRPC_FAIL_FAST"] = "use_caller"  # a lost worker fails fast; its work moves on
        if args.job_name != "chief":  # a ps, or a worker the coordinator drives, serves until
            return run_task(args, serve_until_gone, args, cluster, cluster["chief"][0])  # it ends
    data = load_dataset(args.data_path)  # a bad file fails here too, before TensorFlow loads
    return run_task(args, train, args, cluster, data)  # model.fit


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

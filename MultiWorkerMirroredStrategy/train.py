"""MultiWorkerMirroredStrategy: synchronous training by all-reduce, with no parameter server.

What it teaches
    TensorFlow 2's synchronous data parallelism across machines. Every worker holds a full copy
    of the parameters (a mirrored variable) and runs the same program; each step, every worker
    computes a gradient on its own mini-batch, the workers add up their gradients among
    themselves with an all-reduce (a collective operation: every worker sends and receives
    parts, nobody is in the middle), and each applies the same mean gradient to its copy, so
    the copies stay identical. Compared with ../Sync-SGD: no ps that every gradient crosses,
    no stale gradient to drop, but no backup workers either: a step needs every worker, and a
    lost worker stops the others (here within --step_timeout, with one line) until a rerun
    resumes from the last checkpoint.

The update rule (step t; N workers; the global step counts synchronous steps)
    each worker k:  g_k <- grad L(params_t; next mini-batch of k)
                    g   <- all-reduce mean of g_1 .. g_N                 # among the workers
                    params_{t+1} <- params_t - learning_rate_eff * g     # on every copy
    learning_rate_eff = N * learning_rate: the mean of N gradients is one step for N mini-batches
    (the linear scaling rule, as in Sync-SGD). N counts replicas: a worker with G GPUs is G of
    them (strategy.num_replicas_in_sync), each with its own mini-batch.

Run it
    bash run.sh                                    # 2 workers on free localhost ports
    NUM_WORKERS=3 bash run.sh --steps 3000
    By hand: every worker gets --worker_hosts and its --task_index (--job_name worker); or
    TF_CONFIG with a "worker" job, as the strategy reads it.

Use your own model: replace the sections marked "(replace with your own)", Data and Model.

References
    TensorFlow guide "Multi-worker training with a custom training loop";
    tf.distribute.MultiWorkerMirroredStrategy. P. Goyal et al., "Accurate, Large Minibatch
    SGD: Training ImageNet in 1 Hour", arXiv:1706.02677 (the linear scaling rule).
"""
import argparse
import collections
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
import time

import numpy as np

tf = None  # loaded once the flags are checked: bad input fails in one line, at once
EXAMPLE = "MultiWorkerMirroredStrategy"
JOBS = ("worker",)  # the jobs of its cluster; deploy/ and the tests read them here
PREEMPTED = 42  # the exit status after a SIGTERM saved a checkpoint: start the task again


def example_flags(parser):
    parser.add_argument("--step_timeout", type=positive_float, default=20,
                        help="seconds a collective may wait for the other workers")
    parser.add_argument("--bytes_per_pack", type=non_negative_int, default=0,
                        help="the all-reduce concatenates the gradients into packs of about "
                        "this many bytes, one collective each; 0: all in one pack, one "
                        "collective a step (the fastest measured; 1: one per variable)")


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
Mirrored = collections.namedtuple("Mirrored", "strategy params global_step batches train_step")


def build_mirrored(args, cluster, data):
    """The strategy, the mirrored variables, this worker's dataset, and one synchronous step."""
    # the strategy's start waits for every worker without a bound, and holds Python meanwhile (no
    # thread runs, a SIGTERM waits): so the others wait for the chief's port first, and no longer
    # than --connect_timeout (the chief itself waits on for the others)
    chief = cluster["worker"][0]
    if args.task_index and not wait_for(lambda: is_listening(chief), args.connect_timeout):
        fail("worker %d: the chief (worker 0) at %s did not come up within %g s"
             % (args.task_index, chief, args.connect_timeout))
    strategy = tf.distribute.MultiWorkerMirroredStrategy(  # it reads TF_CONFIG
        communication_options=tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=args.bytes_per_pack, timeout_seconds=args.step_timeout))
    example_shape = data.shape if isinstance(data, Records) else data.x_train.shape[1:]
    with strategy.scope():  # a copy on every worker; the initial values come from worker 0
        params = model_params(example_shape, args.hidden, args.seed, data.num_classes)
        global_step = tf.Variable(0, dtype=tf.int64, name="global_step")

    def dataset_fn(context):  # this worker's own part of the training set, in an order of its
        # own that the global step it starts from mixes in: a resumed run does not replay it
        seed = (args.seed * 1000 + context.input_pipeline_id) * 1000003 + int(global_step.numpy())
        return training_dataset(data, args.batch_size, context.input_pipeline_id,
                                context.num_input_pipelines, seed)
    batches = lambda: iter(strategy.distribute_datasets_from_function(dataset_fn))
    # the linear scaling rule: N mini-batches a step, one on each replica (a worker's GPUs, or
    # its CPU), so N is the number of replicas, not of workers
    learning_rate = args.learning_rate * strategy.num_replicas_in_sync

    @tf.function
    def train_step(iterator):
        def step(x, y):  # on every worker, in lockstep
            with tf.GradientTape() as tape:
                loss = model_loss(params, x, y)
            gradients = tape.gradient(loss, list(params.values()))
            # the loss rides in the gradients' all-reduce: its mean for the progress line costs
            # no collective of its own (a scalar's all-reduce takes as long as a small step's)
            mean_loss, *mean = tf.distribute.get_replica_context().all_reduce(
                "mean", [loss] + gradients)
            for p, g in zip(params.values(), mean):
                p.assign_sub(learning_rate * g)
            return mean_loss
        mean_loss = strategy.run(step, args=next(iterator))
        global_step.assign_add(1)
        return strategy.experimental_local_results(mean_loss)[0]  # the same on every replica
    return Mirrored(strategy, params, global_step, batches, train_step)


# --- The training loop ----------------------------------------------------------------------------
def train(args, cluster, data):
    """Every worker runs this loop; worker 0 (the chief) reports and keeps the checkpoints."""
    mirrored = build_mirrored(args, cluster, data)
    is_chief, replicas = args.task_index == 0, mirrored.strategy.num_replicas_in_sync
    # each worker restores the latest checkpoint in its own --log_dir, and every worker saves (a
    # checkpoint of mirrored variables is collective): the others into a scratch folder
    checkpoint = tf.train.Checkpoint(global_step=mirrored.global_step, **mirrored.params)
    scratch = None if is_chief else tempfile.mkdtemp(prefix="checkpoint-scratch-")
    checkpoints = tf.train.CheckpointManager(checkpoint, scratch or args.log_dir, max_to_keep=3)
    if tf.train.latest_checkpoint(args.log_dir):
        checkpoint.restore(tf.train.latest_checkpoint(args.log_dir))
        print("[worker%d] resuming from the checkpoint at global step %d"
              % (args.task_index, mirrored.global_step.numpy()), flush=True)
    take_the_chiefs_values(args, mirrored)
    run = TrainingRun(args, cluster, mirrored.global_step, lambda x, y: model_metrics(
        mirrored.params, x, y), lambda: test_batches(data), is_chief, replicas)
    iterator = mirrored.batches()  # made now, at the step it starts from
    preemption = on_sigterm_save_and_exit(args, mirrored, checkpoints, scratch)
    last_step = math.ceil(args.steps / replicas)  # --steps counts the mini-batches of all workers
    try:
        for step in range(run.start_step + 1, last_step + 1):
            loss = preemption.run(mirrored.train_step, iterator)  # a step, or save and exit
            if step == run.start_step + 1:  # traced and run once: the clock starts
                run.start_clock()
            if step % args.log_every == 0 or step == last_step:
                run.progress(float(loss))
                checkpoints.save(checkpoint_number=step)  # on every worker: it is collective
    finally:  # at the end, or as a lost peer ends the run (run_task says so in one line)
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    # TensorFlow stops the handler's watch on the other workers in its __del__, which the exit
    # at once (run_task) never runs: a worker still watching once the chief, whose coordination
    # service it watches, has exited prints a traceback (UnavailableError: Socket closed)
    preemption.__del__()
    checksum = sum(float(tf.reduce_sum(p)) for p in mirrored.params.values())
    print("[worker%d] done: parameters checksum=%.9g" % (args.task_index, checksum), flush=True)
    steps = int(mirrored.global_step.numpy())  # every worker took part in every step
    return run.end([steps] * len(cluster["worker"]),
                   learning_rate_eff=args.learning_rate * replicas)


def take_the_chiefs_values(args, mirrored):
    """Every worker has restored the latest checkpoint in its own --log_dir, but only the
    chief's is kept up to date: a worker whose --log_dir is a folder of its own (a pod's
    emptyDir) would start at step 0 from the initial weights while the chief resumes at step S,
    and the copies would differ for the whole run (the strategy copies worker 0's values only
    when it makes the variables). So every copy takes the chief's step and weights, by an
    all-reduce sum to which the first replica (on worker 0) adds its values and every other
    replica zeros."""
    variables = [mirrored.global_step] + list(mirrored.params.values())
    own_step = int(mirrored.global_step.numpy())

    @tf.function
    def broadcast_from_the_chief():
        def replica_fn():
            context = tf.distribute.get_replica_context()
            first = tf.equal(context.replica_id_in_sync_group, 0)
            for v in variables:  # one by one: a list would be packed into one dtype
                v.assign(context.all_reduce("sum", tf.where(first, v, tf.zeros_like(v))))
        mirrored.strategy.run(replica_fn)
    broadcast_from_the_chief()
    step = int(mirrored.global_step.numpy())
    if step != own_step:
        print("[worker%d] resuming at the chief's global step %d, with its weights (this "
              "worker's --log_dir gave step %d)" % (args.task_index, step, own_step), flush=True)


def on_sigterm_save_and_exit(args, mirrored, checkpoints, scratch):
    """A worker sent SIGTERM (what Kubernetes sends a pod it is about to stop, a grace period
    before it kills it): every worker finishes the same step, the chief saves a checkpoint in
    --log_dir (through checkpoints, the run's CheckpointManager; the others in their scratch
    folders, which they then remove), and every worker exits with status PREEMPTED, so that the
    restarted run resumes there (tf.distribute.experimental.PreemptionCheckpointHandler,
    through the cluster's coordination service)."""
    def exit_preempted():
        print("[worker%d] stopped by SIGTERM at global step %d: checkpoint saved in %s; start "
              "the run again to resume (exit status %d)" % (
                  args.task_index, int(mirrored.global_step.numpy()), args.log_dir, PREEMPTED),
              file=sys.stderr, flush=True)
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        sys.stdout.flush()
        os._exit(PREEMPTED)  # the strategy's threads would keep an ordinary exit waiting
    save = lambda: checkpoints.save(checkpoint_number=int(mirrored.global_step.numpy()))
    # The handler counts the steps it runs, saves that count, and restores it from the
    # checkpoints it is handed: the chief would count on from its checkpoint's count and a
    # worker whose --log_dir lacks it from 0, and they would never agree on the step to save
    # at. Handed an empty checkpoint that nothing saves (saves go through save), every worker
    # counts from 0; the run restores the weights itself.
    count_from_zero = tf.train.CheckpointManager(
        tf.train.Checkpoint(), os.path.join(args.log_dir, "never-written"), max_to_keep=1)
    with google_cloud_unseen():
        handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            mirrored.strategy.cluster_resolver, count_from_zero, termination_config=(
                tf.distribute.experimental.TerminationConfig(exit_fn=exit_preempted,
                                                             save_fn=save)))
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        print("[worker%d] warning: TensorFlow's PreemptionCheckpointHandler set no SIGTERM "
              "handler: a SIGTERM ends this worker without a checkpoint" % args.task_index,
              file=sys.stderr, flush=True)
    return handler


@contextlib.contextmanager
def google_cloud_unseen():
    """TensorFlow 2.21's handler asks the metadata server at $GCE_METADATA_IP (by default
    metadata.google.internal) whether it runs on Google Cloud (on_gcp). If so, it sets no SIGTERM
    handler: on a CPU (or TPU) VM it watches nothing at all, whatever its TerminationConfig
    says; on a GPU VM it polls the host-maintenance notice and trains on up to an hour after
    it. Told "not Google Cloud" while the handler starts, it sets its SIGTERM handler, and a
    SIGTERM saves and exits on every platform alike (a GPU VM's maintenance notice is not
    watched: the SIGTERM of the VM's shutdown is). Its platform check is replaced for that
    window, not the environment: the strategy's threads run meanwhile, and a setenv is neither
    thread-safe nor undone for a library that read the variable then."""
    from tensorflow.python.distribute.failure_handling import failure_handling_util as platform
    on_gcp = platform.on_gcp
    platform.on_gcp = lambda: False  # what detect_platform asks, for the handler's platform
    try:
        yield
    finally:
        platform.on_gcp = on_gcp


def main(argv=None):
    args = parse_flags(argv, example_flags)  # bad input fails here, before TensorFlow loads
    cluster = tf2_cluster(args, JOBS)
    data = load_dataset(args.data_path)  # a bad file fails here too, before TensorFlow loads
    return run_task(args, train, args, cluster, data)


# ==================================================================================================
# Plumbing shared by every example (what a job needs besides its algorithm)
# ==================================================================================================
# Each block is one text in every train.py that has it (a test checks); this file's, in order:
# flags, tasks, npz, records, summary, tf2 cluster, tf2 data, tf2 run.
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

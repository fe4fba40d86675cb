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
import glob
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
Mirrored = collections.namedtuple("Mirrored", "strategy params global_step iterator train_step")


def build_mirrored(args, cluster, data):
    """The strategy, the mirrored variables, this worker's dataset, and one synchronous step."""
    strategy = tf.distribute.MultiWorkerMirroredStrategy(  # reads TF_CONFIG; waits for all
        communication_options=tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=args.bytes_per_pack, timeout_seconds=args.step_timeout))
    with strategy.scope():  # a copy on every worker; the initial values come from worker 0
        params = model_params(example_shape(data), args.hidden, args.seed, data.num_classes)
        global_step = tf.Variable(0, dtype=tf.int64, name="global_step")

    def dataset_fn(context):  # this worker's own part of the training set
        return training_dataset(data, args.batch_size, context.input_pipeline_id,
                                context.num_input_pipelines, args.seed)
    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
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
    return Mirrored(strategy, params, global_step, iterator, train_step)


# --- The training loop ----------------------------------------------------------------------------
def train(args, cluster, data):
    """Every worker runs this loop; worker 0 (the chief) reports and keeps the checkpoints."""
    workers = len(cluster["worker"])
    mirrored = build_mirrored(args, cluster, data)
    checkpoint = tf.train.Checkpoint(global_step=mirrored.global_step, **mirrored.params)
    run = TrainingRun(args, cluster, lambda x, y: model_metrics(mirrored.params, x, y),
                      data, checkpoint, is_chief=args.task_index == 0,
                      after_restore=lambda: take_the_chiefs_values(args, mirrored))
    preemption = on_sigterm_save_and_exit(args, mirrored, run)
    replicas = mirrored.strategy.num_replicas_in_sync  # a mini-batch each in every step
    last_step = math.ceil(args.steps / replicas)  # --steps counts the mini-batches of all workers
    try:
        for step in range(run.start_step + 1, last_step + 1):
            loss = preemption.run(mirrored.train_step, mirrored.iterator)  # a step, or save, exit
            if step == run.start_step + 1:  # traced and run once: the clock starts
                run.start_clock(step)
            if step % args.log_every == 0 or step == last_step:
                run.progress(float(loss), step)  # every worker saves: a checkpoint is collective
    except tf.errors.OpError:  # a lost peer: run_and_exit says so in one line and exits
        run.remove_scratch()
        raise
    checksum = sum(float(tf.reduce_sum(p)) for p in mirrored.params.values())
    print("[worker%d] done: parameters checksum=%.9g" % (args.task_index, checksum), flush=True)
    steps = int(mirrored.global_step.numpy())
    return run.end(steps, [steps] * workers, minibatches_per_update=replicas,
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


def on_sigterm_save_and_exit(args, mirrored, run):
    """A worker sent SIGTERM (what Kubernetes sends a pod it is about to stop, a grace period
    before it kills it): every worker finishes the same step, the chief saves a checkpoint in
    --log_dir (through run.manager, the run's CheckpointManager; the others in their scratch
    folders, which they then remove), and every worker exits with status PREEMPTED, so that the
    restarted run resumes there (tf.distribute.experimental.PreemptionCheckpointHandler,
    through the cluster's coordination service)."""
    def exit_preempted():
        print("[worker%d] stopped by SIGTERM at global step %d: checkpoint saved in %s; start "
              "the run again to resume (exit status %d)" % (
                  args.task_index, int(mirrored.global_step.numpy()), args.log_dir, PREEMPTED),
              file=sys.stderr, flush=True)
        run.remove_scratch()
        sys.stdout.flush()
        os._exit(PREEMPTED)  # the strategy's threads would keep an ordinary exit waiting
    save = lambda: run.manager.save(checkpoint_number=int(mirrored.global_step.numpy()))
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
    start_tensorflow(args, cluster)
    return run_and_exit(train, args, cluster, data)


# ==================================================================================================
# Plumbing shared by every example (what a job needs besides its algorithm)
# ==================================================================================================
# What a task of a TensorFlow 2 cluster needs besides its algorithm, in this order; the same text
# in every TensorFlow 2 train.py (a test keeps the copies equal):
#   1. flags, each number of its type, and the cluster from them  parse_flags, number_type,
#      or from TF_CONFIG; --data_path's file, checked             tf2_cluster, check_cluster,
#                                                                  read_npz, Pixels, as_float32,
#                                                                  port_taken
#   2. TensorFlow loads after the checks; a failure ends the task
#      in one line                                                start_tensorflow, run_and_exit,
#                                                                  fail, cause
#   3. a server with nothing of its own to run ends itself once
#      the task it serves is gone                                 serve_until_gone, wait_for,
#                                                                  is_listening, is_gone
#   4. checkpoints and resume; progress lines with the test
#      metrics; TensorBoard summaries                             TrainingRun, progress
#   5. the summary line                                           end, print_summary
#   6. the data's way in: TFRecord files, each worker reading     read_records, check_shards,
#      its own; the test set in batches; a Keras model's weights  count_records, records_dataset,
#      as the parameters (start_the_data: the tf.compat.v1        parse_records, arrays_dataset,
#      examples')                                                 example_shape, test_batches,
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


# >>> shared: tf2 cluster
def tf2_cluster(args, jobs):
    """The cluster from the flags, or else from TF_CONFIG; jobs: the job names this example uses
    (its JOBS). Writes the result into TF_CONFIG, where the strategies read it, and sets
    args.job_name and args.task_index, and connect_timeout if not given: 60 s, or 600 s under
    TF_CONFIG."""
    given = {"chief": getattr(args, "chief_host", ""), "worker": args.worker_hosts,
             "ps": args.ps_hosts}
    from_flags = args.job_name or any(given.values()) or "TF_CONFIG" not in os.environ
    if args.connect_timeout is None:  # a cluster's pods may start minutes apart
        args.connect_timeout = 60.0 if from_flags else 600.0
    if from_flags:
        if not all(given[job] for job in jobs):
            flags = ["--chief_host" if job == "chief" else "--%s_hosts" % job for job in jobs]
            fail("give %s (or set TF_CONFIG)" % " and ".join(flags))
        cluster = {job: given[job].replace(" ", "").split(",") for job in jobs}
        job, index = args.job_name, args.task_index
    else:
        try:
            config = json.loads(os.environ["TF_CONFIG"])
            spec = dict(config["cluster"])
            job, index = config["task"]["type"], int(config["task"].get("index") or 0)
            if "chief" in spec and "chief" not in jobs:  # a chief of workers is worker 0
                chief = list(spec.pop("chief"))
                spec["worker"] = chief + list(spec.get("worker", []))
                if job == "chief":
                    job, index = "worker", 0
                elif job == "worker":
                    index += len(chief)  # the workers come after the chief
            cluster = {name: list(spec[name]) for name in jobs}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            fail("TF_CONFIG is not valid cluster JSON for %s (%s: %s)"
                 % ("/".join(jobs), type(e).__name__, e))
        if job == "evaluator":
            fail("an evaluator task is not needed here: the %s evaluates; remove it from "
                 "TF_CONFIG" % ("chief" if "chief" in jobs else "worker 0"))
    check_cluster(cluster, job, index)
    os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster,
                                          "task": {"type": job, "index": index}})
    args.job_name, args.task_index = job, index
    return cluster


def start_tensorflow(args, cluster):
    """Check this task's port, then load TensorFlow (eager, as TensorFlow 2 runs)."""
    global tf  # loaded only now: bad input has failed in one line, without TensorFlow's start-up
    address = cluster[args.job_name][args.task_index]
    if port_taken(address):  # in one line here, rather than deep inside gRPC
        fail("%s %d: port %s is already in use: by an earlier run, or another program?"
             % (args.job_name, args.task_index, address))
    if os.environ.get("VERBOSE") != "1":  # before the import: TensorFlow's C++ log reports
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # every peer that leaves as an error
    import tensorflow as tf
    tf.get_logger().setLevel("ERROR")


def serve_until_gone(args, cluster, watched):
    """A server that has nothing to run itself (a ps; a worker the coordinator drives): serve
    until the process at address watched has come and gone. TensorFlow's server never stops
    and join() ignores SIGTERM, so the process ends itself once it is no longer needed."""
    role = "%s%d" % (args.job_name, args.task_index)
    tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=args.job_name,
                         task_index=args.task_index, protocol="grpc", start=True)
    print("[%s] serving at %s until %s is done"
          % (role, cluster[args.job_name][args.task_index], watched), flush=True)
    if not wait_for(lambda: is_listening(watched), args.connect_timeout):
        fail("%s: %s did not come up within %.0f s" % (role, watched, args.connect_timeout))
    wait_for(is_gone(watched, args.connect_timeout))
    print("[%s] %s is gone; shutting down" % (role, watched), flush=True)
    os._exit(0)  # the server's threads would keep an ordinary exit waiting forever


def is_gone(address, silence):
    """A check for wait_for: whether the process at address is gone. Its port refusing a
    connection says so at once; a connection that is not answered does only after silence
    seconds of it (a host that is down never answers, but a busy slow link answers late: at
    20 Mbit/s the coordinator's start-up filled its link for seconds, and a ps that took the
    unanswered connection for the end shut down under a run that had just started)."""
    unanswered_since = [None]

    def check():
        try:
            socket.create_connection(address.rsplit(":", 1), timeout=1).close()
        except ConnectionRefusedError:
            return True
        except OSError:  # no answer within the second, or no route for now
            unanswered_since[0] = unanswered_since[0] or time.time()
            return time.time() - unanswered_since[0] > silence
        unanswered_since[0] = None
        return False
    return check


def run_and_exit(train, args, cluster, data):
    """Run train(args, cluster, data); a lost peer ends the task in one line. Then exit at once:
    the strategy's threads would keep an ordinary exit waiting for servers that are gone."""
    try:
        code = train(args, cluster, data)
    except tf.errors.OpError as e:
        lost = isinstance(e, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError))
        why = "a peer is gone or did not answer in time" if lost else cause(e)
        print("error: %s %d stopped: %s: %s" % (args.job_name, args.task_index,
                                                type(e).__name__, why), file=sys.stderr)
        code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
# <<< shared: tf2 cluster


# >>> shared: tf2 run
class TrainingRun(object):
    """The run as this task keeps it: checkpoints (the latest in --log_dir restored at the start,
    one saved with every progress line and at the end), progress lines, and the chief's test
    metrics, TensorBoard summaries and summary line. train() hands it test_metrics(x, y), a dict
    of metrics for a batch of test examples (each a mean over the batch), and test_set (the
    data, or arrays (x, y): test_batches), fed to it in batches; and after_restore(), if
    given, which runs once this task has restored what its --log_dir holds, before the step it
    starts from is read."""

    def __init__(self, args, cluster, test_metrics, test_set, checkpoint, is_chief=True,
                 after_restore=None):
        self.args, self.cluster, self.is_chief = args, cluster, is_chief
        self.test_metrics, self.test_set = test_metrics, test_set
        self.role = "%s%d" % (args.job_name, args.task_index)
        # every task restores the latest checkpoint in its --log_dir; only the chief's saves are
        # kept (with MultiWorkerMirroredStrategy every task must save: the others save to
        # scratch, and after_restore() then gives every copy the chief's values)
        self.scratch = None if is_chief else tempfile.mkdtemp(prefix="checkpoint-scratch-")
        self.manager = tf.train.CheckpointManager(checkpoint, self.scratch or args.log_dir,
                                                  max_to_keep=3)
        latest = tf.train.latest_checkpoint(args.log_dir)
        if latest:
            checkpoint.restore(latest)
            print("[%s] resuming from the checkpoint at global step %d"
                  % (self.role, int(checkpoint.global_step.numpy())), flush=True)
        if after_restore:
            after_restore()
        self.start_step = int(checkpoint.global_step.numpy())
        self.writer = tf.summary.create_file_writer(args.log_dir) if is_chief else None
        self.history = []
        self.start_clock(self.start_step)  # again when the loop's first step returns
        print("[%s] training started: log_dir=%s" % (self.role, args.log_dir), flush=True)

    def start_clock(self, global_step):
        """The run's clock (its rates, its history's seconds) starts once the first step has
        returned, in every example: set-up, and the tracing of the step function, untimed. The
        loop calls it with the global step then."""
        self.started = self.progress_time = time.time()
        self.timed_from_step = self.progress_step = global_step

    def evaluate(self, global_step, loss=None):
        """The test metrics, each a mean over the test set, 1000 examples at a time; also to
        TensorBoard, with the loss if given."""
        totals, examples = {}, 0
        for x, y in test_batches(self.test_set):
            for name, value in self.test_metrics(x, y).items():
                totals[name] = totals.get(name, 0.0) + float(value) * len(x)
            examples += len(x)
        metrics = {name: total / examples for name, total in totals.items()}
        seconds = round(time.time() - self.started, 3)
        self.history.append([seconds, global_step] + list(metrics.values()))
        with self.writer.as_default():
            for name, value in metrics.items():
                tf.summary.scalar("test_" + name, value, step=global_step)
            if loss is not None:
                tf.summary.scalar("loss", loss, step=global_step)
        return metrics

    def progress(self, loss, global_step):
        """A progress line, a checkpoint; the chief adds the test metrics and summaries."""
        rate = (global_step - self.progress_step) / (time.time() - self.progress_time)
        line = "[%s] global_step=%d loss=%.4f" % (self.role, global_step, loss)
        if self.is_chief:
            for name, value in self.evaluate(global_step, loss).items():
                line += " test_%s=%.4f" % (name, value)
        print(line + " steps_per_sec=%.1f" % rate, flush=True)
        self.manager.save(checkpoint_number=global_step)
        self.progress_step, self.progress_time = global_step, time.time()

    def end(self, global_step, local_steps, lost_workers=0, minibatches_per_update=1, **extra):
        """The final checkpoint; the chief evaluates and prints the summary (and its JSON)."""
        self.manager.save(checkpoint_number=global_step)
        if not self.is_chief:
            self.remove_scratch()
            return 0
        seconds = time.time() - self.started
        minibatches = (global_step - self.timed_from_step) * minibatches_per_update
        summary = dict(example=EXAMPLE)
        for name, value in self.evaluate(global_step).items():
            summary["test_" + name] = value
        summary.update(
            global_step=global_step, workers=len(self.cluster["worker"]),
            ps=len(self.cluster.get("ps", [])), lost_workers=lost_workers,
            local_steps=local_steps, updates=global_step - self.start_step,
            timed_from_step=self.timed_from_step, timed_seconds=seconds,
            steps_per_sec=minibatches / seconds,
            examples_per_sec=minibatches * self.args.batch_size / seconds, **extra)
        self.writer.close()
        print_summary(self.role, summary, self.history, self.args.metrics_file)
        return 0

    def remove_scratch(self):
        """A task that is not the chief removes its scratch checkpoints: at the end, and before
        any os._exit (which skips every clean-up)."""
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
# <<< shared: tf2 run


if __name__ == "__main__":
    sys.exit(main())

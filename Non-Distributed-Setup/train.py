"""Non-Distributed-Setup: the digits classifier in one process, the baseline for every example.

What it teaches
    The learning problem every example in this guide shares, with nothing distributed about it:
    a tf.data pipeline of handwritten digits, a small MLP built from explicit variables, plain
    SGD, and a training loop in one tf.compat.v1.Session. ../Distributed-Setup/train.py is this
    file plus a cluster; read the two side by side to see exactly what distribution adds.

The update rule (each step)
    g      <- grad L(params; next mini-batch)
    params <- params - learning_rate * g
    (--optimizer adamw: Adam's step of g instead, and the weight decay apart from it; the baseline
    of the examples whose workers step with AdamW, such as DiLoCo)

Run it
    bash run.sh                      # or: python train.py --steps 2000
    python train.py --data_path mnist.npz  # MNIST (or your own images) instead of the digits
    python train.py --optimizer adamw --learning_rate 0.001   # AdamW instead of plain SGD

Use your own model
    Replace the two sections marked "(replace with your own)": Data (load_dataset) and Model
    (model_params, model_loss, model_metrics).

References
    Y. LeCun, L. Bottou, Y. Bengio, P. Haffner, "Gradient-based learning applied to document
    recognition", Proc. IEEE 1998 (the MNIST digits).
"""
import argparse
import collections
import glob
import json
import os
import sys
import time

import numpy as np

tf = None  # loaded once the flags are checked: bad input fails in one line, at once
EXAMPLE = "Non-Distributed-Setup"
JOBS = ()  # one process, no cluster; deploy/ and the tests read this here


def example_flags(parser):
    """Besides the flags every example shares (see parse_flags): the optimizer."""
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "adamw"),
                        help="plain SGD, or AdamW: Adam with its weight decay apart from "
                             "the gradient (try --learning_rate 0.001) (default: sgd)")
    parser.add_argument("--weight_decay", type=non_negative_float, default=0.01,
                        help="AdamW's (default: 0.01)")


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
SGD = collections.namedtuple("SGD", "params global_step loss step")


def build_sgd(args, x, y, num_classes=10):
    """One step on the mini-batch (x, y): read the parameters, compute the gradient, apply it
    (all of it here, in this process)."""
    global_step = tf.compat.v1.train.get_or_create_global_step()
    params = model_params(x.shape[1:], args.hidden, args.seed, num_classes)
    loss = model_loss(params, x, y)
    if args.optimizer == "adamw":  # AdamW (Loshchilov and Hutter, ICLR 2019)
        train_op = tf.compat.v1.train.AdamOptimizer(args.learning_rate).minimize(
            loss, global_step=global_step)
        with tf.control_dependencies([train_op]):  # the decay, apart from the gradient
            train_op = tf.group([p.assign_sub(args.learning_rate * args.weight_decay * p)
                                 for p in params.values()])
    else:
        train_op = tf.compat.v1.train.GradientDescentOptimizer(args.learning_rate).minimize(
            loss, global_step=global_step)
    with tf.control_dependencies([train_op]):
        step = global_step.read_value()  # one update; its value: the global step after it
    return SGD(params, global_step, loss, step)


# --- The training loop ----------------------------------------------------------------------------
def train(args, data):
    x, y = training_batches(data, args.batch_size, 0, 1, args.seed)  # all of it: one "worker"
    sgd = build_sgd(args, x, y, data.num_classes)
    run = Run(args, lambda x, y: model_metrics(sgd.params, x, y), data)
    # TensorFlow's MonitoredTrainingSession in this process: it restores the last checkpoint
    # or initialises the variables; its hooks stop at --steps of the global step, save
    # checkpoints and print progress
    with run.session(sgd.loss, sgd.step, last_step=args.steps) as session:
        while not session.should_stop():
            session.run(sgd.step)
    return 0


def main(argv=None):
    global tf
    args = parse_flags(argv, example_flags)  # bad input fails here, before TensorFlow loads
    data = load_dataset(args.data_path)  # a bad file fails here too
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before the import: no C++ info lines
    import tensorflow as tf  # only now: bad input has failed in one line, before its start-up
    tf.compat.v1.disable_eager_execution()  # graphs and sessions: the tf.compat.v1 runtime
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)  # no deprecation notes
    return train(args, data)


# ==================================================================================================
# Plumbing shared by every example (what a job needs besides its algorithm)
# ==================================================================================================
# What this one-process example shares with the others, in this order (a test keeps the copies
# equal):
#   1. flags, each number of its type; --data_path's file, checked
#                                parse_flags, fail, number_type, read_npz, Pixels, as_float32
#   2. the summary line          print_summary
#   3. the test metrics over the test set, in batches; TensorBoard
#                                test_metrics_in_batches, tensorboard_summary
#   4. the data's way in: TFRecord files; arrays that are no constant of the graph; the test set
#      in batches; each session's order of the training stream; a Keras model's weights as the
#      parameters
#                                read_records, check_shards, count_records, records_dataset,
#                                parse_records, arrays_dataset, example_shape, test_batches,
#                                record_batches, session_stream, start_the_data, keras_params,
#                                keras_logits
#   5. the run: TensorFlow's MonitoredTrainingSession (the last checkpoint restored, or the
#      variables initialised; checkpoints), with StopAtStepHook and a hook of this file's for
#      the progress lines and the summary; what Distributed-Setup's Worker does, on one process
#                                Run, Hook, Progress
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


# >>> shared: local run
class Run(object):
    """The one process's run, given what train() built: test_metrics(x, y), a dict of metric
    tensors for a batch of test examples (each a mean over the batch), and test_set (the data),
    fed to it in batches. session(): TensorFlow's MonitoredTrainingSession in this process,
    with --log_dir its checkpoint_dir (it restores the latest checkpoint, or initialises the
    variables; it saves a checkpoint every 30 s and at the end) and two hooks:
    StopAtStepHook (at last_step) and Progress (this file's)."""
    role = "local"

    def __init__(self, args, test_metrics, test_set):
        self.args, self.test_set = args, test_set
        self.global_step = tf.compat.v1.train.get_or_create_global_step()
        x_test, y_test = next(test_batches(test_set, 1))  # an example: the placeholders' types
        self.test_x = tf.compat.v1.placeholder(x_test.dtype, (None,) + x_test.shape[1:])
        self.test_y = tf.compat.v1.placeholder(y_test.dtype, (None,) + y_test.shape[1:])
        self.test_metrics = test_metrics(self.test_x, self.test_y)

    def session(self, loss, update, last_step):
        """The session, with the loss and update of a step (update's value: the global step
        after it) for the progress lines."""
        print("[local] log_dir=%s" % self.args.log_dir, flush=True)
        resumes = tf.train.latest_checkpoint(self.args.log_dir) is not None
        hooks = [tf.compat.v1.train.StopAtStepHook(last_step=last_step),
                 Progress(self, loss, update, resumes)]
        return tf.compat.v1.train.MonitoredTrainingSession(
            checkpoint_dir=self.args.log_dir, hooks=hooks, save_checkpoint_secs=30,
            save_summaries_steps=None, save_summaries_secs=None, log_step_count_steps=None,
            config=tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1))


class Hook(object):
    """tf.compat.v1.train.SessionRunHook's five methods, each doing nothing: the base of this
    file's hook, which MonitoredSession calls as it calls TensorFlow's (TensorFlow loads after
    the flags are checked, so no class here can derive from its own)."""

    def begin(self):
        pass

    def after_create_session(self, session, coord):
        pass

    def before_run(self, run_context):
        return None

    def after_run(self, run_context, run_values):
        pass

    def end(self, session):
        pass


class Progress(Hook):
    """The run's start (the training stream started in the session, start_the_data), then a
    progress line with the test metrics every --log_every steps (to TensorBoard too), and at
    the end the test metrics and the summary line: what Distributed-Setup's Progress does, on
    one process. (TensorFlow's LoggingTensorHook prints a step's tensors, not metrics of a test
    set fed in batches, nor a run's summary.)"""

    def __init__(self, run, loss, update, resumes):
        self.run, self.loss, self.update, self.resumes = run, loss, update, resumes
        self.local_steps, self.history = 0, []

    def begin(self):  # the writer MonitoredTrainingSession's CheckpointSaverHook uses
        self.writer = tf.compat.v1.summary.FileWriterCache.get(self.run.args.log_dir)

    def after_create_session(self, session, coord):
        self.step = self.start_step = int(session.run(self.run.global_step))
        if self.resumes:
            print("[local] resuming from the checkpoint at global step %d" % self.step,
                  flush=True)
        start_the_data(session, self.step)  # a resumed run draws a new order, no replay
        self.start_clock()  # again at the first update
        print("[local] training started", flush=True)

    def start_clock(self):
        """The run's clock (its rates, its history's seconds) starts once the first update has
        returned, in every example: set-up, and the first step's own preparation, untimed."""
        self.start_time = self.progress_time = time.time()
        self.timed_from_step, self.progress_steps = self.step, self.local_steps

    def before_run(self, run_context):
        fetches = tf.nest.flatten(run_context.original_args.fetches)
        if any(fetch is self.update for fetch in fetches):  # a step, not a read
            return tf.compat.v1.train.SessionRunArgs({"loss": self.loss, "step": self.update})
        return None

    def after_run(self, run_context, run_values):
        """Count the update; every --log_every steps a progress line with the test metrics."""
        if run_values.results is None:
            return
        loss, self.step = float(run_values.results["loss"]), int(run_values.results["step"])
        self.local_steps += 1
        if self.local_steps == 1:  # the clock starts as the first update returns (start_clock)
            self.start_clock()
        if self.local_steps % self.run.args.log_every:
            return
        rate = (self.local_steps - self.progress_steps) / (time.time() - self.progress_time)
        line = "[local] local_step=%d global_step=%d loss=%.4f" % (
            self.local_steps, self.step, loss)
        for name, value in self.evaluate(run_context.session, loss).items():
            line += " test_%s=%.4f" % (name, value)
        print(line + " steps_per_sec=%.1f" % rate, flush=True)
        self.progress_steps, self.progress_time = self.local_steps, time.time()

    def evaluate(self, session, loss=None):
        """The test metrics over the test set, in batches; also to TensorBoard."""
        run = self.run
        metrics = test_metrics_in_batches(session, run.test_metrics, run.test_x, run.test_y,
                                          run.test_set)
        self.writer.add_summary(tensorboard_summary(metrics, loss), self.step)
        self.history.append([round(time.time() - self.start_time, 3), self.step]
                            + list(metrics.values()))
        return metrics

    def end(self, session):
        """The test metrics and the summary line (the checkpoint: CheckpointSaverHook's end)."""
        args = self.run.args
        self.step = int(session.run(self.run.global_step))
        summary = dict(example=EXAMPLE)
        for name, value in self.evaluate(session).items():  # what it saves
            summary["test_" + name] = value
        updates, seconds = self.step - self.start_step, time.time() - self.start_time
        rate = (self.step - self.timed_from_step) / seconds
        summary.update(global_step=self.step, workers=1, ps=0, lost_workers=0,
                       local_steps=[updates], updates=updates, timed_from_step=self.timed_from_step,
                       timed_seconds=seconds, steps_per_sec=rate,
                       examples_per_sec=rate * args.batch_size, log_dir=args.log_dir)
        print_summary(self.run.role, summary, self.history, args.metrics_file)
        self.writer.flush()
# <<< shared: local run


if __name__ == "__main__":
    sys.exit(main())

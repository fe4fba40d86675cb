"""Non-Distributed-Setup: the digits classifier in one process, the baseline for every example.

What it teaches
    The learning problem every example in this guide shares, with nothing distributed about it:
    a tf.data pipeline of handwritten digits, a small MLP built from explicit variables, plain
    SGD (or AdamW), and a loop in TensorFlow's MonitoredTrainingSession, which checkpoints and
    resumes. ../Distributed-Setup/train.py is this file plus a cluster: read them side by side.

The update rule (each step)
    g      <- grad L(params; next mini-batch)
    params <- params - learning_rate * g      (--optimizer adamw: Adam's step, decay apart)

Run it
    bash run.sh                            # or: python train.py --steps 2000
    python train.py --data_path mnist.npz  # MNIST (or your own images) instead of the digits

Use your own model: replace the sections marked "(replace with your own)", Data and Model.
Reference: Y. LeCun et al., "Gradient-based learning applied to document recognition", 1998.
"""
import argparse
import collections
import os
import sys
import time

import numpy as np

tf = None  # loaded once the flags are checked: bad input fails in one line, at once
EXAMPLE = "Non-Distributed-Setup"
JOBS = ()  # one process, no cluster; deploy/ and the tests read this here


def example_flags(parser):
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "adamw"),
                        help="plain SGD, or AdamW: Adam with its weight decay apart from "
                             "the gradient (try --learning_rate 0.001) (default: sgd)")
    parser.add_argument("--weight_decay", type=non_negative_float, default=0.01,
                        help="AdamW's (default: 0.01)")


# --- Data (replace with your own) -----------------------------------------------------------------
# >>> shared: local data
Dataset = collections.namedtuple("Dataset", "x_train y_train x_test y_test num_classes x_scale",
                                 defaults=[1.0])  # x_scale: integer pixels are divided by it


def load_dataset(data_path=""):
    """By default scikit-learn's 1797 handwritten 8x8 digits (offline; a fixed fifth to test),
    rows of 64 pixels in [0, 1], labels 0-9; or data_path's .npz, checked below the banner."""
    if data_path:  # an .npz (read_npz)
        return Dataset(*read_npz(data_path))
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0,
                                                        stratify=y)
    return Dataset((x_train / 16).astype(np.float32), y_train.astype(np.int64),
                   (x_test / 16).astype(np.float32), y_test.astype(np.int64), num_classes=10)


def training_dataset(data, batch_size, worker_index, num_workers, seed):
    """This worker's endless stream of mini-batches: its own shard, reshuffled every epoch."""
    ds = arrays_dataset(data.x_train, data.y_train, worker_index, num_workers, seed, data.x_scale)
    return ds.repeat().batch(batch_size, drop_remainder=True).prefetch(2)
# <<< shared: local data


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
    # or initialises the variables; its hooks stop at --steps, save checkpoints, print progress
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
# train() hands it what it built (the step's tensors, the test metrics, the data): nothing here
# knows the model or the algorithm. Each block is the same text in every train.py that uses it (a
# test compares them); this file's, in order:
# flags, npz, graph arrays, graph stream, graph test set, summary, local run.
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


# >>> shared: local run
class Run(object):
    """The run in this one process: TensorFlow's MonitoredTrainingSession, with --log_dir its
    checkpoint_dir (it restores the latest checkpoint or initialises; it saves every 30 s and at
    the end), StopAtStepHook, and this object as a hook of its own: a new order of the data in
    each session, a progress line with the test metrics every --log_every steps (to TensorBoard
    too) and the summary line at the end. (Distributed-Setup's Worker does this on a cluster.)"""
    role = "local"
    begin = lambda self: None  # (a SessionRunHook's; TensorFlow loads after the flags)

    def __init__(self, args, test_metrics, data):
        self.args, self.local_steps = args, 0
        self.global_step = tf.compat.v1.train.get_or_create_global_step()
        self.test_set = test_metrics_of(test_metrics, data)

    def session(self, loss, update, last_step):
        self.loss, self.update = loss, update
        print("[local] log_dir=%s" % self.args.log_dir, flush=True)
        self.writer = tf.compat.v1.summary.FileWriterCache.get(self.args.log_dir)
        return tf.compat.v1.train.MonitoredTrainingSession(
            checkpoint_dir=self.args.log_dir, save_checkpoint_secs=30, save_summaries_steps=None,
            save_summaries_secs=None, log_step_count_steps=None, hooks=[
                tf.compat.v1.train.StopAtStepHook(last_step=last_step), self],
            config=tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1))

    def after_create_session(self, session, coord):
        self.step = self.start_step = self.timed_from = int(session.run(self.global_step))
        if self.step:
            print("[local] resuming from the checkpoint at global step %d" % self.step, flush=True)
        start_the_data(session, self.step)  # a resumed run draws a new order: no replay
        self.clock = time.time()
        print("[local] training started", flush=True)

    def before_run(self, run_context):
        if run_context.original_args.fetches is self.update:  # a step, not a read
            return tf.compat.v1.train.SessionRunArgs((self.update, self.loss))

    def after_run(self, run_context, run_values):
        """Count the step; every --log_every a progress line with the test metrics."""
        if run_values.results is None:
            return
        (self.step, loss), self.local_steps = run_values.results, self.local_steps + 1
        if self.local_steps == 1:  # the clock starts as the first step returns
            self.clock, self.timed_from = time.time(), self.step
        if self.local_steps % self.args.log_every == 0:
            line = "[local] local_step=%d global_step=%d loss=%.4f" % (
                self.local_steps, self.step, loss)
            for name, value in self.evaluate(run_context.session, loss).items():
                line += " test_%s=%.4f" % (name, value)
            print(line + " steps_per_sec=%.1f" % self.rate(), flush=True)

    def rate(self):
        return (self.step - self.timed_from) / max(time.time() - self.clock, 1e-9)

    def evaluate(self, session, loss=None):
        """The test metrics over the test set, to TensorBoard too (with the loss, if given)."""
        metrics = mean_over_the_test_set(session, *self.test_set)
        values = [("test_" + name, value) for name, value in metrics.items()]
        self.writer.add_summary(tf.compat.v1.Summary(value=[
            tf.compat.v1.Summary.Value(tag=tag, simple_value=value) for tag, value in
            values + ([("loss", loss)] if loss is not None else [])]), self.step)
        return metrics

    def end(self, session):
        """The test metrics and the summary line (the checkpoint: CheckpointSaverHook's end)."""
        self.step, rate = int(session.run(self.global_step)), self.rate()  # before evaluating
        summary = dict(example=EXAMPLE, **{"test_" + n: v for n, v in self.evaluate(
            session).items()})
        updates = self.step - self.start_step
        summary.update(global_step=self.step, workers=1, ps=0, lost_workers=0,
                       local_steps=[updates], updates=updates, steps_per_sec=rate)
        print_summary(self.role, summary)
        self.writer.flush()
# <<< shared: local run


if __name__ == "__main__":
    sys.exit(main())

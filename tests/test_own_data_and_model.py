"""A copied folder takes a user's own data and model: the Data and Model code replaced, nothing
else touched, and the job trains. Also: an .npz given with --data_path loads as it is (floats stay
floats, integer pixels are scaled, images keep their shape), and a malformed one is refused in
one line before TensorFlow loads.

The full matrix of substitutions and folders is marked `substitutions` (left out by default);
the default run covers each substitution and each family of plumbing:

    python -m pytest tests/test_own_data_and_model.py -m substitutions
"""
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from support.examples import (ROOT, USERS_ENVIRONMENT, error_lines, example_dir,
                              run_train_noting_tensorflow)
from support.processes import assert_nothing_left
from support.runs import finish, start_run_sh

BANNER = "# Plumbing shared by every example"
DATA_BLOCK = re.compile(r"^# >>> shared: (local )?data\n.*?^# <<< shared: (local )?data\n",
                        re.S | re.M)  # the baseline's is its own: no TFRecord files
MODEL_BLOCK = re.compile(r"^# >>> shared: model\n.*?^# <<< shared: model\n", re.S | re.M)

# (a) float features with negative values: the digits standardised (mean 0, sd 1 per pixel)
STANDARDISED_DATA = '''Dataset = collections.namedtuple("Dataset", "x_train y_train x_test y_test num_classes")


def load_dataset(data_path=""):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0,
                                                        stratify=y)
    mean, sd = x_train.mean(axis=0), x_train.std(axis=0) + 1e-6
    x_train, x_test = (x_train - mean) / sd, (x_test - mean) / sd  # negatives, as they are
    return Dataset(x_train.astype(np.float32), y_train.astype(np.int64),
                   x_test.astype(np.float32), y_test.astype(np.int64), num_classes=10)


def training_dataset(data, batch_size, worker_index, num_workers, seed):
    ds = arrays_dataset(data.x_train, data.y_train, worker_index, num_workers, seed)
    return ds.repeat().batch(batch_size, drop_remainder=True)
'''

# (b) a regression: real-valued targets, a mean-squared-error loss, no accuracy
REGRESSION_DATA = '''Dataset = collections.namedtuple("Dataset", "x_train y_train x_test y_test num_classes")


def load_dataset(data_path=""):
    from sklearn.datasets import make_regression
    x, y = make_regression(n_samples=2400, n_features=10, n_informative=8, noise=10.0,
                           random_state=0)
    x, y = x.astype(np.float32), (y / y.std()).astype(np.float32)
    return Dataset(x[:2000], y[:2000], x[2000:], y[2000:], num_classes=1)  # one output


def training_dataset(data, batch_size, worker_index, num_workers, seed):
    ds = arrays_dataset(data.x_train, data.y_train, worker_index, num_workers, seed)
    return ds.repeat().batch(batch_size, drop_remainder=True)
'''

def regression_model():
    """The MLP's Model code with the edits docs/own-model.md shows: a mean-squared-error loss
    on its one output (the data's num_classes is 1), and the error's mean square and mean
    absolute value as the test metrics."""
    with open(os.path.join(example_dir("Distributed-Setup"), "train.py")) as f:
        model = MODEL_BLOCK.search(f.read()).group(0)
    edits = [
        ("""    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=y, logits=model_logits(params, x)))""",
         """    return tf.reduce_mean(tf.square(tf.reshape(model_logits(params, x), [-1]) - y))"""),
        ("""    correct = tf.equal(tf.argmax(model_logits(params, x), 1), y)
    return {"accuracy": tf.reduce_mean(tf.cast(correct, tf.float32))}""",
         """    error = tf.reshape(model_logits(params, x), [-1]) - y
    return {"mse": tf.reduce_mean(tf.square(error)), "mae": tf.reduce_mean(tf.abs(error))}"""),
    ]
    for old, new in edits:
        assert model.count(old) == 1, old
        model = model.replace(old, new)
    return model


# (c) images (N, H, W, C) and a small convolutional model
IMAGE_DATA = '''Dataset = collections.namedtuple("Dataset", "x_train y_train x_test y_test num_classes")


def load_dataset(data_path=""):
    from sklearn.datasets import load_digits
    digits = load_digits()
    images = (digits.images / 16).astype(np.float32)[..., np.newaxis]  # (1797, 8, 8, 1)
    labels = digits.target.astype(np.int64)
    return Dataset(images[:1440], labels[:1440], images[1440:], labels[1440:], num_classes=10)


def training_dataset(data, batch_size, worker_index, num_workers, seed):
    ds = arrays_dataset(data.x_train, data.y_train, worker_index, num_workers, seed)
    return ds.repeat().batch(batch_size, drop_remainder=True)
'''

CONV_MODEL = '''def model_params(input_shape, hidden, seed, num_classes):
    """A 3x3 convolution of 16 channels, a 2x2 max-pool, and a linear layer."""
    glorot = lambda i: tf.compat.v1.glorot_uniform_initializer(seed=seed * 10 + i)
    zeros = tf.compat.v1.zeros_initializer()
    height, width, channels = [int(n) for n in input_shape]
    pooled = (height // 2) * (width // 2) * 16
    return {"kernel": tf.compat.v1.get_variable("kernel", [3, 3, channels, 16],
                                                initializer=glorot(1)),
            "bias": tf.compat.v1.get_variable("bias", [16], initializer=zeros),
            "w": tf.compat.v1.get_variable("w", [pooled, num_classes], initializer=glorot(2)),
            "b": tf.compat.v1.get_variable("b", [num_classes], initializer=zeros)}


def logits(params, x):
    features = tf.nn.relu(tf.nn.conv2d(x, params["kernel"], 1, "SAME") + params["bias"])
    pooled = tf.nn.max_pool2d(features, 2, 2, "VALID")
    rows = tf.reshape(pooled, [-1, int(np.prod(pooled.shape[1:]))])
    return tf.matmul(rows, params["w"]) + params["b"]


def model_loss(params, x, y):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=y, logits=logits(params, x)))


def model_metrics(params, x, y):
    correct = tf.equal(tf.argmax(logits(params, x), 1), y)
    return {"accuracy": tf.reduce_mean(tf.cast(correct, tf.float32))}
'''

# (d) the same convolution written with Keras, as docs/own-model.md shows it (its code, read from
# there): tf_keras (Keras 2, the Keras that tf.compat.v1 graphs take) in the classic examples,
# Keras 3 in TensorFlow 2's
OWN_MODEL_MD = os.path.join(ROOT, "docs", "own-model.md")


def keras_recipe():
    """docs/own-model.md's Keras section: (its Model code, its bash lines)."""
    with open(OWN_MODEL_MD) as f:
        section = f.read().split("## A Keras model", 1)[1].split("\n## ", 1)[0]
    return (re.search(r"```python\n(.*?)```", section, re.S).group(1),
            re.search(r"```bash\n(.*?)```", section, re.S).group(1))


KERAS_CONV_MODEL = keras_recipe()[0]
TF2 = ("ParameterServerStrategy", "MultiWorkerMirroredStrategy")


def keras_model(example):
    """The Keras model's code for an example: Keras 3 in TensorFlow 2's, seeded its own way."""
    if example not in TF2:
        return KERAS_CONV_MODEL
    model = KERAS_CONV_MODEL
    for old, new in (('import tf_keras as keras  # in the tf.compat.v1 examples; "import keras" '
                      "(Keras 3) in TF2's", "import keras  # Keras 3, which TensorFlow 2 installs"),
                     ("tf.compat.v1.set_random_seed(seed)  # TF2: "
                      "keras.utils.set_random_seed(seed)", "keras.utils.set_random_seed(seed)")):
        assert model.count(old) == 1, old
        model = model.replace(old, new)
    return model


# what each substitution replaces, and what its run of 1200 mini-batches must reach: measured
# over the 21 cases (python -m pytest -m substitutions tests/test_own_data_and_model.py -rP),
# floats 0.967-0.972, regression test_mse 0.0047-0.0058, images 0.888-0.933
SUBSTITUTIONS = {
    "floats_with_negatives": dict(data=STANDARDISED_DATA, model=None,
                                  bar=("test_accuracy", ">=", 0.93)),
    "regression": dict(data=REGRESSION_DATA, model=regression_model(),
                       bar=("test_mse", "<=", 0.02)),
    "images_and_a_convolution": dict(data=IMAGE_DATA, model=CONV_MODEL,
                                     bar=("test_accuracy", ">=", 0.85)),
    "keras_convolution": dict(data=IMAGE_DATA, model=keras_model,
                              bar=("test_accuracy", ">=", 0.85)),
}
FOLDERS = ["Distributed-Setup", "DOWNPOUR", "Sync-SGD", "EASGD", "DiLoCo",
           "ParameterServerStrategy", "MultiWorkerMirroredStrategy"]
# a Keras model in every folder whose Model section a user replaces (Model-Parallel-Pipeline
# splits its own layers over the tasks; the Sparse-Embeddings have a table, not this model)
KERAS_FOLDERS = FOLDERS + ["Non-Distributed-Setup", "Hogwild", "ADAG", "DynSGD", "AEASGD",
                           "EAMSGD", "Gradient-Compression", "Evolution-Strategies",
                           "In-Graph-Replication"]
DEFAULT_RUN = {  # each substitution and each family of appendix (classic, TensorFlow 2's two);
    # a Keras model in each family of algorithm: windowed, synchronous, DiLoCo, TensorFlow 2
    ("Distributed-Setup", "images_and_a_convolution"), ("DOWNPOUR", "regression"),
    ("Sync-SGD", "floats_with_negatives"), ("ParameterServerStrategy", "regression"),
    ("MultiWorkerMirroredStrategy", "images_and_a_convolution"),
    ("DOWNPOUR", "keras_convolution"), ("Sync-SGD", "keras_convolution"),
    ("DiLoCo", "keras_convolution"), ("MultiWorkerMirroredStrategy", "keras_convolution")}


def copy_with_own_data_and_model(example, destination, substitution):
    """Copy the folder, then replace its Data code and (if given) its Model code; returns the
    original train.py's text and the copy's."""
    shutil.copytree(example_dir(example), destination,
                    ignore=shutil.ignore_patterns("logs", "__pycache__"))
    with open(os.path.join(example_dir(example), "train.py")) as f:
        original = f.read()
    text = original
    if substitution["data"]:
        text, replaced = DATA_BLOCK.subn(lambda m: substitution["data"], original)
        assert replaced == 1, example
    model = substitution["model"]
    if model:
        model = model(example) if callable(model) else model
        text, replaced = MODEL_BLOCK.subn(lambda m: model, text)
        assert replaced == 1, example
    with open(os.path.join(destination, "train.py"), "w") as f:
        f.write(text)
    return original, text


def run_copy(folder, args, timeout=240, env=None):
    """The copy's run.sh; env: values to set for it (None: to remove), as a user's Keras needs."""
    return finish(start_run_sh(folder, args, env), timeout)


def cases():
    for name in SUBSTITUTIONS:
        for example in KERAS_FOLDERS if name == "keras_convolution" else FOLDERS:
            marks = [] if (example, name) in DEFAULT_RUN else [pytest.mark.substitutions]
            yield pytest.param(example, name, marks=marks, id="%s-%s" % (example, name))


@pytest.mark.parametrize("example, name", list(cases()))
def test_a_copied_folder_trains_on_its_own_data_and_model_with_the_plumbing_unchanged(
        example, name, tmp_path):
    substitution = SUBSTITUTIONS[name]
    folder = str(tmp_path / example)
    original, copy = copy_with_own_data_and_model(example, folder, substitution)
    # every line from the banner down is the original's, byte for byte
    assert copy[copy.index(BANNER):] == original[original.index(BANNER):]
    keras = USERS_ENVIRONMENT if name == "keras_convolution" else None  # the tests skip Keras
    run = run_copy(folder, ["--steps", "1200", "--log_dir", str(tmp_path / "logs")], env=keras)
    assert_nothing_left(folder)
    errors = [line for line in run.output.splitlines() if "error" in line.lower()]
    assert run.code == 0, "\n".join(errors[:10]) + "\n...\n" + run.output[-2000:]
    key, direction, bar = substitution["bar"]
    reached = float(run.summary()[key])
    print("%s %s: %s=%.4f" % (example, name, key, reached))  # the figures behind the bars
    assert reached >= bar if direction == ">=" else reached <= bar, (key, reached, bar)
    if name == "regression":  # no accuracy anywhere: the metrics are the model's own
        assert "test_accuracy" not in run.output and "test_mae=" in run.output


# --- --data_path --------------------------------------------------------------------------------
def load(example, path):
    from support.examples import load_train_module
    return load_train_module(example).load_dataset(str(path))


def test_floats_stay_floats_with_their_values_and_negatives(tmp_path):
    rng = np.random.default_rng(0)
    arrays = dict(x_train=rng.normal(size=(40, 6)), y_train=rng.integers(0, 10, 40),
                  x_test=rng.normal(size=(10, 6)), y_test=rng.integers(0, 10, 10))
    np.savez(tmp_path / "floats.npz", **arrays)
    data = load("Distributed-Setup", tmp_path / "floats.npz")
    assert data.x_train.dtype == np.float32 and data.x_train.min() < 0
    np.testing.assert_allclose(data.x_train, arrays["x_train"], rtol=1e-6)  # not scaled
    np.testing.assert_array_equal(data.y_test, arrays["y_test"])


def test_images_without_a_channel_axis_gain_one_and_keep_their_height_and_width(tmp_path):
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "images.npz", x_train=rng.random((20, 5, 7)), y_train=np.arange(20) % 3,
             x_test=rng.random((4, 5, 7)), y_test=np.arange(4) % 3)
    data = load("Distributed-Setup", tmp_path / "images.npz")
    assert data.x_train.shape == (20, 5, 7, 1) and data.x_test.shape == (4, 5, 7, 1)


def malformed(name):
    """A small valid set, then one thing wrong with it."""
    rng = np.random.default_rng(2)
    arrays = dict(x_train=rng.random((30, 4)), y_train=rng.integers(0, 10, 30),
                  x_test=rng.random((8, 4)), y_test=rng.integers(0, 10, 8))
    if name == "nan":
        arrays["x_train"][3, 1] = np.nan
    elif name == "infinite":
        arrays["x_test"][0, 0] = np.inf
    elif name == "lengths":
        arrays["y_train"] = arrays["y_train"][:-1]
    elif name == "fractional labels":
        arrays["y_train"] = arrays["y_train"] + 0.5
    elif name == "labels of two numbers":
        arrays["y_test"] = np.stack([arrays["y_test"]] * 2, axis=1)
    elif name == "negative labels":
        arrays["y_train"][0] = -1
    elif name == "shapes":
        arrays["x_test"] = rng.random((8, 5))
    elif name == "missing key":
        del arrays["y_test"]
    elif name == "not numbers":
        arrays["x_train"] = np.array(["a"] * 30)
    return arrays


MALFORMED = {  # the problem, and what its one line says
    "nan": "x_train has NaN or infinite values",
    "infinite": "x_test has NaN or infinite values",
    "lengths": "x and y differ in length: 30 and 29 to train",
    "fractional labels": "y_train must hold class labels: whole numbers from 0",
    "labels of two numbers": "y_test must hold class labels: whole numbers from 0",
    "negative labels": "y_train must hold class labels: whole numbers from 0",
    "shapes": "train and test examples differ in shape: (4,) and (5,)",
    "missing key": "give an .npz with x_train, y_train, x_test and y_test",
    "not numbers": "x_train must be a non-empty array of numbers",
}
WAYS_TO_RUN = {  # a worker of a cluster, and the one-process baseline
    "Distributed-Setup": ["--job_name", "worker", "--ps_hosts", "localhost:1",
                          "--worker_hosts", "localhost:2"],
    "Non-Distributed-Setup": [],
}


@pytest.mark.parametrize("example", sorted(WAYS_TO_RUN))
@pytest.mark.parametrize("problem", sorted(MALFORMED))
def test_a_malformed_data_file_is_refused_in_one_line_before_tensorflow_loads(
        example, problem, tmp_path):
    path = tmp_path / "bad.npz"
    np.savez(path, **malformed(problem))
    code, _, stderr, loaded = run_train_noting_tensorflow(
        example, WAYS_TO_RUN[example] + ["--data_path", str(path), "--log_dir",
                                         str(tmp_path / "logs")])
    assert code == 2 and not loaded, (code, stderr)
    assert error_lines(stderr) == stderr.splitlines() and len(error_lines(stderr)) == 1, stderr
    assert str(path) in stderr and MALFORMED[problem] in stderr, stderr


# --- A Keras model ------------------------------------------------------------------------------
def run_keras(tmp_path, script, timeout=120):
    """script run in a process of its own with the user's Keras (the tests' processes skip it),
    `module` a copy of DOWNPOUR whose Model section is docs/own-model.md's Keras recipe, with its
    adapter, and TensorFlow as `tf`; returns its stdout."""
    from support.examples import ROOT
    folder = str(tmp_path / "keras-copy")
    copy_with_own_data_and_model("DOWNPOUR", folder, dict(data=None, model=KERAS_CONV_MODEL))
    env = {k: v for k, v in dict(os.environ, **USERS_ENVIRONMENT).items() if v is not None}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "tests")] + [
        p for p in [env.get("PYTHONPATH")] if p])
    prelude = ("import numpy as np\nimport tensorflow as tf\n"
               "from support.examples import load_module\n"
               "module = load_module(%r, 'keras_copy')\nmodule.tf = tf\n"
               % os.path.join(folder, "train.py"))
    proc = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(script)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


# a layer whose sublayer's kernel is made before its own weight of the same shape: model.weights
# lists its own first, so a copy that took the weights in that order would swap the two
NESTED_KERAS_MODEL = '''
import tf_keras as keras


class Block(keras.layers.Layer):
    def build(self, shape):
        self.inner = keras.layers.Dense(4, use_bias=False)
        self.inner.build(shape)
        self.scale = self.add_weight(name="scale", shape=(4, 4))

    def call(self, x):
        return tf.matmul(self.inner(x), self.scale)


with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), Block(), keras.layers.Dense(3)])
    params = module.keras_params(model)
    print("weights:", " ".join(params))
    print("made:", " ".join(v.op.name for v in tf.compat.v1.global_variables()))
    copy = {name: tf.identity(p) for name, p in params.items()}  # another dict of the same names
    x = tf.constant(np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32))
    own, other = module.keras_logits(params, x), module.keras_logits(copy, x)
    wrong = dict(copy, **{"dense/bias": tf.zeros([4])})
    try:
        module.keras_logits(wrong, x)
    except ValueError as e:
        print("wrong shape:", e)
    with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        own, other = session.run([own, other])
    print("largest difference:", np.abs(own - other).max())
'''


def test_keras_logits_takes_each_weight_by_its_name_and_checks_its_shape(tmp_path):
    out = run_keras(tmp_path, NESTED_KERAS_MODEL)
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    # the case in question: the order of model.weights is not the order the weights were made
    assert lines["weights"].split()[:2] == ["block/scale", "block/kernel"], out
    assert lines["made"].split()[:2] == ["block/kernel", "block/scale"], out
    assert float(lines["largest difference"]) == 0.0, out  # the copy is the model, weight by weight
    assert "dense/bias has the shape (3,), the dict's (4,)" in lines["wrong shape"], out


# each model differs from the convolution above by one layer (or argument) that acts otherwise in
# training than at test; the examples run every layer as at test and train every weight by its
# gradient, so such a model is refused, and what its one line names
TRAINING_ONLY = {
    "dropout": ("keras.layers.Dropout(0.5)", "layer dropout (Dropout) acts at random in training"),
    "noise": ("keras.layers.GaussianNoise(0.1)",
              "layer gaussian_noise (GaussianNoise) acts at random in training"),
    "batch_normalization": ("keras.layers.BatchNormalization()", "layer batch_normalization "
                            "(BatchNormalization) has weights not trained by gradients"),
    "frozen_layer": ('keras.layers.Conv2D(4, 3, trainable=False, name="frozen")',
                     "layer frozen (Conv2D) has weights not trained by gradients"),
    "regulariser": ('keras.layers.Conv2D(4, 3, kernel_regularizer="l2")',
                    "regulariser (model.losses) adds to the loss"),
}


@pytest.mark.parametrize("kind", sorted(TRAINING_ONLY))
def test_a_keras_model_that_acts_otherwise_in_training_is_refused_in_one_line(kind, tmp_path):
    layer, says = TRAINING_ONLY[kind]
    out = run_keras(tmp_path, '''
        import contextlib, io
        import tf_keras as keras
        for layer in ("keras.layers.Dropout(0.0)", %r):  # no dropout at all, then the one refused
            with tf.Graph().as_default():
                model = keras.Sequential([keras.Input((8, 8, 1)), eval(layer),
                                          keras.layers.Flatten(), keras.layers.Dense(10)])
                stderr = io.StringIO()
                try:
                    with contextlib.redirect_stderr(stderr):
                        print("params:", len(module.keras_params(model)))
                except SystemExit as e:
                    said = stderr.getvalue().rstrip().replace("\\n", "|")
                    print("exit %%s: %%s" %% (e.code, said))
        ''' % layer)
    accepted, refused = out.splitlines()
    assert accepted == "params: 2", out
    assert refused.startswith("exit 2: error: the Keras model's %s: the examples run every layer "
                              "as at test" % says) and "|" not in refused, out


def test_a_copy_with_a_keras_dropout_layer_stops_in_one_line_before_training(tmp_path):
    model = KERAS_CONV_MODEL.replace("keras.layers.Flatten(),",
                                     "keras.layers.Flatten(), keras.layers.Dropout(0.5),")
    folder = str(tmp_path / "DOWNPOUR")
    copy_with_own_data_and_model("DOWNPOUR", folder, dict(data=IMAGE_DATA, model=model))
    run = run_copy(folder, ["--steps", "50", "--log_dir", str(tmp_path / "logs")], timeout=120,
                   env=USERS_ENVIRONMENT)
    assert_nothing_left(folder)
    assert run.code != 0, run.output[-2000:]
    refusals = [l for l in run.output.splitlines() if "error: the Keras model's layer dropout" in l]
    assert refusals and all(l.startswith("[worker") for l in refusals), run.output[-2000:]
    assert "local_step=" not in run.output, run.output[-2000:]  # no progress line: no step


def test_docs_keras_recipe_trains_a_copy_on_the_digits_saved_as_images_offline(tmp_path):
    # as a new user would: the copy outside the repository, its Model section the doc's, its
    # EXAMPLE renamed; the doc's lines save the digits as (N, 8, 8) and train the copy on them
    model, commands = keras_recipe()
    save, run_line = commands.strip().rsplit("\n", 1)
    saved = subprocess.run(["bash", "-c", save], cwd=tmp_path, capture_output=True, text=True,
                           timeout=120)
    assert saved.returncode == 0, saved.stderr[-2000:]
    with np.load(tmp_path / "digits.npz") as f:
        assert f["x_train"].shape == (1440, 8, 8) and f["x_test"].shape == (357, 8, 8)
    folder = str(tmp_path / "my-job")
    _, text = copy_with_own_data_and_model("DOWNPOUR", folder, dict(data=None, model=model))
    assert text.count('EXAMPLE = "DOWNPOUR"') == 1
    with open(os.path.join(folder, "train.py"), "w") as f:
        f.write(text.replace('EXAMPLE = "DOWNPOUR"', 'EXAMPLE = "my-job"'))
    # Keras is imported where the model is made: a bad flag still fails before TensorFlow loads
    code, _, stderr, loaded = run_train_noting_tensorflow(folder, ["--steps", "-1"],
                                                          env=USERS_ENVIRONMENT)
    assert code == 2 and not loaded and len(error_lines(stderr)) == 1, stderr
    args = run_line.split("run.sh ", 1)[1].replace("digits.npz", str(tmp_path / "digits.npz"))
    assert run_line.startswith("bash ~/my-job/run.sh ") and "--data_path" in args
    run = run_copy(folder, args.split() + ["--log_dir", str(tmp_path / "logs")],
                   env=USERS_ENVIRONMENT)
    assert_nothing_left(folder)
    assert run.code == 0, run.output[-3000:]
    summary = run.summary()
    assert summary["example"] == "my-job" and float(summary["test_accuracy"]) >= 0.85, summary

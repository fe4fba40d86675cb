"""The example folders, their train.py loaded as a module, and a train.py run by itself."""
import importlib.util
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ACCURACY_BAR = 0.95  # the test accuracy every example on the digits must reach with its defaults
# Sparse-Embeddings' clicks, ranked: measured 0.669 and 0.674 (lr 15) with the defaults, 2000
# mini-batches, 1 ps + 2 workers; chance is 0.5 and the hidden model's own scores reach 0.893
AUC_BAR = 0.62

# `import tensorflow` loads Keras in full (its optimizers, for a registry): about 1.4 of the 3.8
# CPU-seconds each process spends starting here, and the suite starts some 450 TensorFlow
# processes on 2 cores. The default examples use no Keras, so the tests' processes skip it
# (conftest.py calls skip_keras_at_import): with TF_USE_LEGACY_KERAS=1 TensorFlow looks for
# tf_keras instead, and support/no_keras, first on PYTHONPATH, makes that import fail at once (the
# real tf_keras is installed, for the Keras models of docs/own-model.md), so TensorFlow goes on
# without Keras, and a tf.keras in an example would fail loudly. Each example's runs with its
# defaults (support/runs.py, DefaultRuns) and the runs of a Keras model keep the environment the
# README gives users, Keras and all: USERS_ENVIRONMENT.
NO_KERAS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "no_keras")
USERS_KERAS = "TESTS_USERS_TF_USE_LEGACY_KERAS"  # the user's own value, for the processes started
# after skip_keras_at_import (pytest-xdist's workers among them), which inherit the tests' value


def users_environment():
    """The variables as the user had them before skip_keras_at_import, in any process of a test
    run: TF_USE_LEGACY_KERAS as it was, PYTHONPATH without support/no_keras (None: unset)."""
    legacy = os.environ.get(USERS_KERAS, os.environ.get("TF_USE_LEGACY_KERAS"))
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != NO_KERAS]
    return {"TF_USE_LEGACY_KERAS": legacy or None, "PYTHONPATH": os.pathsep.join(path) or None}


USERS_ENVIRONMENT = users_environment()


def skip_keras_at_import():
    """From now on this process and all it starts import TensorFlow without Keras."""
    if USERS_KERAS not in os.environ:
        os.environ[USERS_KERAS] = os.environ.get("TF_USE_LEGACY_KERAS", "")
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    path = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if NO_KERAS not in path:
        os.environ["PYTHONPATH"] = os.pathsep.join([NO_KERAS] + [p for p in path if p])
    if NO_KERAS not in sys.path:
        sys.path.insert(0, NO_KERAS)


def load_module(path, name):
    """Import the file at path as a module called name, once: a second call returns the first."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


# deploy/manifests.py: the one reader of a train.py's JOBS
manifests = load_module(os.path.join(ROOT, "deploy", "manifests.py"), "manifests")
# the maintainer's tool that copies the shared text: which reference file each example follows
sync_shared = load_module(os.path.join(ROOT, "tools", "sync_shared.py"), "sync_shared")


def example_dir(example):
    return os.path.join(ROOT, example)


def declared_jobs(example):
    """The jobs an example's train.py declares in its JOBS constant: () for one process,
    ("ps", "worker") for the classic examples, the TensorFlow 2 strategies' own otherwise."""
    jobs = manifests.declared_jobs(os.path.join(example_dir(example), "train.py"))
    assert jobs is not None, "%s/train.py declares no JOBS" % example
    return jobs


def _find_examples():
    """The examples, by name (sync_shared.EXAMPLES: a folder copied inside the repository is
    none); the classic distributed ones run on a ps with the workers' own sessions (JOBS =
    ("ps", "worker"))."""
    found = sorted(sync_shared.EXAMPLES)
    return found, [d for d in found if declared_jobs(d) == ("ps", "worker")]


EXAMPLES, DISTRIBUTED_EXAMPLES = _find_examples()


def load_train_module(example):
    """Import an example's train.py as a module (its main() only runs when executed), with
    TensorFlow loaded into it as main() would: the file defers the import to check flags first.
    A process that must set TF_CONFIG before TensorFlow loads calls this after setting it."""
    import tensorflow as tf
    module = load_module(os.path.join(example_dir(example), "train.py"),
                         "train_" + re.sub(r"\W", "_", example))
    module.tf = tf
    return module


def environment_without_tf_config(env=None):
    """This process's environment less TF_CONFIG (a train.py would read it), plus env (a value
    None: the variable removed, as USERS_ENVIRONMENT gives it)."""
    full_env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    full_env.update(env or {})
    return {k: v for k, v in full_env.items() if v is not None}


def run_train(example, args, env=None, timeout=60):
    """Run one train.py directly (example: a folder's name, or a copy's path); returns (exit
    code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, os.path.join(example_dir(example), "train.py")]
                          + list(args), env=environment_without_tf_config(env),
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def run_train_noting_tensorflow(example, args, env=None, timeout=60):
    """run_train, also telling whether the process had imported TensorFlow when it exited:
    (exit code, stdout, stderr, loaded)."""
    script = os.path.join(example_dir(example), "train.py")
    wrapper = ("import atexit, runpy, sys\n"
               "atexit.register(lambda: print('tensorflow loaded:', 'tensorflow' in sys.modules))\n"
               "sys.argv = [%r] + %r\n"
               "runpy.run_path(%r, run_name='__main__')\n" % (script, list(args), script))
    proc = subprocess.run([sys.executable, "-c", wrapper], env=environment_without_tf_config(env),
                          capture_output=True, text=True, timeout=timeout)
    loaded = [l for l in proc.stdout.splitlines() if l.startswith("tensorflow loaded: ")]
    assert loaded, "the process did not report its modules:\n" + proc.stdout[-2000:]
    return proc.returncode, proc.stdout, proc.stderr, loaded[-1].endswith("True")


def error_lines(stderr):
    """The lines our code wrote to stderr (TensorFlow's own start-up lines are not ours)."""
    return [l for l in stderr.splitlines() if l.startswith("error: ")]

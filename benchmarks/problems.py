"""The problems the benchmarks compare the examples on, chosen with --problem.

digits   each example's own data: scikit-learn's 8x8 handwritten digits, which every example
         learns to 0.97 or so in seconds; a problem this easy shows how fast, not how well.
mnist1d  MNIST-1D (S. Greydanus, D. Kobak, "Scaling Down Deep Learning with MNIST-1D", 2020,
         arXiv:2011.14439; the `mnist1d` package): 4000 training and 1000 test signals of 40
         floats, 10 classes, where a linear model reaches 32% and the authors' MLP 68%, so
         staleness, windows and averaging can show in the accuracy. Made once with the
         package's defaults (its make_dataset, offline; never its get_dataset, which downloads)
         and cached as an .npz that every example takes through --data_path.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBLEMS = ("digits", "mnist1d")
CACHE = os.path.join(ROOT, "benchmarks", "data", "mnist1d.npz")  # ignored by git
VALIDATION = 400  # the training signals a tuning run is scored on, never trained on

# make_dataset reseeds the global random and np.random of the process it runs in, so it runs in
# a process of its own: a benchmark's own random numbers stay what they were
MAKE_MNIST1D = """
import sys
import numpy as np
from mnist1d.data import get_dataset_args, make_dataset
d = make_dataset(get_dataset_args())
np.savez(sys.argv[1], x_train=d["x"], y_train=d["y"], x_test=d["x_test"], y_test=d["y_test"])
"""


def data_path(problem):
    """What --data_path an example gets for problem: "" (its own data) for the digits, the
    cached MNIST-1D file for mnist1d (made now if it is not there)."""
    if problem not in PROBLEMS:
        raise ValueError("--problem: choose one of %s, not %r" % (", ".join(PROBLEMS), problem))
    return "" if problem == "digits" else mnist1d_npz(CACHE)


def validation_path(problem):
    """What --data_path a tuning run gets: the problem's training set split in two, the last
    VALIDATION examples of a fixed shuffle as its "test" arrays and the rest to train on, so
    that choosing a learning rate never sees the test set. Made once, beside the data."""
    import numpy as np
    if problem != "mnist1d":
        raise ValueError("--tune: the validation split is made for mnist1d only, not %r"
                         % problem)
    source = data_path(problem)
    path = source[:-len(".npz")] + "-validation.npz"
    if not os.path.exists(path):
        with np.load(source) as d:
            x, y = d["x_train"], d["y_train"]
        order = np.random.RandomState(0).permutation(len(x))
        train, held_out = order[:-VALIDATION], order[-VALIDATION:]
        partial = "%s.%d.npz" % (path[:-len(".npz")], os.getpid())
        np.savez(partial, x_train=x[train], y_train=y[train], x_test=x[held_out],
                 y_test=y[held_out])
        os.replace(partial, path)
    return path


def mnist1d_npz(path):
    """The path of MNIST-1D as an .npz at path (x_train 4000 x 40, y_train, x_test 1000 x 40,
    y_test), made on first use; later calls find it and make nothing."""
    if os.path.exists(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = "%s.%d.npz" % (path[:-len(".npz")], os.getpid())  # never a half-written cache
    made = subprocess.run([sys.executable, "-c", MAKE_MNIST1D, partial], capture_output=True,
                          text=True, timeout=300)
    if made.returncode != 0:
        if os.path.exists(partial):
            os.remove(partial)
        last = (made.stderr.strip().splitlines() or ["exit %d" % made.returncode])[-1]
        raise RuntimeError("could not make MNIST-1D (%s): pip install -r requirements.txt "
                           "installs the mnist1d package" % last)
    os.replace(partial, path)
    return path

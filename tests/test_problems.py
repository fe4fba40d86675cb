"""benchmarks/problems.py: MNIST-1D is made once, in a process of its own, cached as an .npz,
and every run of a benchmark with --problem mnist1d gets it as --data_path. No training here:
the make takes a few seconds each time."""
import os
import random
import sys

import numpy as np
import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import problems  # noqa: E402  (benchmarks/ is not a package)
import readme  # noqa: E402
import runs  # noqa: E402


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    """MNIST-1D made once into a fresh cache path, as a first benchmark run makes it."""
    path = str(tmp_path_factory.mktemp("cache") / "data" / "mnist1d.npz")
    assert problems.mnist1d_npz(path) == path
    return path


def test_mnist1d_has_the_papers_shapes_floats_and_ten_balanced_classes(cached):
    with np.load(cached) as d:
        assert d["x_train"].shape == (4000, 40) and d["x_test"].shape == (1000, 40)
        assert d["y_train"].shape == (4000,) and d["y_test"].shape == (1000,)
        assert d["x_train"].dtype.kind == "f" and d["x_train"].min() < 0  # signals, not pixels
        assert set(np.unique(d["y_train"])) == set(range(10))
        assert np.bincount(d["y_train"]).min() > 300  # about 400 of each


def test_a_cached_mnist1d_is_found_and_not_made_again(cached, monkeypatch):
    before = os.stat(cached).st_mtime_ns

    def refuse(*args, **kwargs):
        raise AssertionError("MNIST-1D was made again")
    monkeypatch.setattr(problems.subprocess, "run", refuse)
    assert problems.mnist1d_npz(cached) == cached
    assert os.stat(cached).st_mtime_ns == before


def test_making_mnist1d_twice_gives_the_same_arrays_and_leaves_the_callers_random_state(
        cached, tmp_path):
    random.seed(7)
    np.random.seed(7)
    python_state, numpy_state = random.getstate(), np.random.get_state()
    again = problems.mnist1d_npz(str(tmp_path / "again.npz"))
    assert random.getstate() == python_state  # make_dataset reseeds only its own process
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), numpy_state))
    with np.load(cached) as first, np.load(again) as second:
        for key in ("x_train", "y_train", "x_test", "y_test"):
            np.testing.assert_array_equal(first[key], second[key])


def test_a_failed_make_says_what_to_install_and_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr(problems, "MAKE_MNIST1D", "import no_such_module_for_this_test")
    with pytest.raises(RuntimeError, match="pip install -r requirements.txt"):
        problems.mnist1d_npz(str(tmp_path / "mnist1d.npz"))
    assert os.listdir(tmp_path) == []


def parsed(argv):
    p = runs.argparse_for("test.py", "a benchmark")
    runs.add_run_flags(p, problem=True)
    return runs.parse_run_flags(p, argv)


def test_problem_mnist1d_gives_every_run_the_cached_file_its_target_and_its_own_folder(
        cached, monkeypatch, tmp_path):
    monkeypatch.setattr(problems, "CACHE", cached)
    digits, mnist1d = parsed([]), parsed(["--problem", "mnist1d"])
    assert (digits.data_path, digits.target, digits.out) == ("", 0.95, readme.RESULTS)
    assert mnist1d.data_path == cached and mnist1d.target == runs.TARGETS["mnist1d"] < 0.68
    assert mnist1d.out == os.path.join(readme.RESULTS, "mnist1d")
    commands = []

    class Started:  # what run_example starts, recorded instead of run
        def __init__(self, command, **kwargs):
            commands.append(command)

        def wait(self, timeout=None):
            return 1
    monkeypatch.setattr(runs.subprocess, "Popen", Started)
    for args in (digits, mnist1d):
        args.out = str(tmp_path)
        with pytest.raises(SystemExit):  # each attempt "fails", so it stops after two
            runs.run_example("DOWNPOUR", 2, args, "t", seed=5)
    digits_run, mnist1d_run = commands[0], commands[-1]
    assert "--data_path" not in digits_run
    assert mnist1d_run[mnist1d_run.index("--data_path") + 1] == cached
    assert mnist1d_run[mnist1d_run.index("--seed") + 1] == "5"


def test_mnist1d_figures_publish_to_a_section_of_their_own_and_only_from_their_folder(
        cached, monkeypatch):
    monkeypatch.setattr(problems, "CACHE", cached)
    args = parsed(["--problem", "mnist1d"])
    assert runs.section("compare.py", args) == "compare.py#mnist1d"
    assert runs.section("compare.py", parsed([])) == "compare.py"
    assert runs.publishing(args, False, published=problems.PROBLEMS)
    assert not runs.publishing(args, False)  # a script that publishes only the digits
    args.out = readme.RESULTS  # MNIST-1D figures never land on the digits' files
    assert not runs.publishing(args, False, published=problems.PROBLEMS)

"""The fixtures the test modules share, and the markers' rules. Helpers live in support/ (a test
module imports them from there, never from here)."""
import pytest

from support.examples import skip_keras_at_import
from support.processes import assert_nothing_left
from support.runs import DefaultRuns, run_example as run_example_in

skip_keras_at_import()  # before any test imports TensorFlow (support/examples.py says why)


@pytest.fixture
def run_example(tmp_path):
    """run_example(example, *args, env=..., timeout=..., log_dir=...) -> Run, its run.sh started
    in the test's own temp folder; asserts that no process of it is left."""
    def run(example, *args, env=None, timeout=180, log_dir=None):
        return run_example_in(example, tmp_path, *args, env=env, timeout=timeout,
                              log_dir=log_dir)
    yield run
    assert_nothing_left(str(tmp_path))


@pytest.fixture(scope="session")
def default_runs(tmp_path_factory):
    """default_runs[example]: the example's run.sh with its defaults, run once in the session,
    the first time a test asks for it (tests/test_examples_end_to_end.py checks what every run
    shows; a test of one example reads the same run for what only that example shows)."""
    return DefaultRuns(tmp_path_factory)


def pytest_collection_modifyitems(config, items):
    """Every test of an algorithm's rule (marked rule) is in the quick tier too."""
    for item in items:
        if item.get_closest_marker("rule"):
            item.add_marker(pytest.mark.quick)

"""The fixtures the test modules share, and the markers' rules. Helpers live in support/ (a test
module imports them from there, never from here)."""
import pytest

from support.examples import skip_keras_at_import
from support.processes import assert_nothing_left
from support.runs import DefaultRuns, run_example as run_example_in

skip_keras_at_import()  # before any test imports TensorFlow (support/examples.py says why)


def room_for_threads(pid_max=4194304):
    """The in-process clusters' gRPC servers keep their threads until a test process ends: two
    xdist workers reached some 22,000 threads, and with the default pid_max (32768) a later
    run.sh's TensorFlow failed to start one ("Resource temporarily unavailable"). Raised where
    this may write it (as root, as CI runs); otherwise left as it is."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            if int(f.read()) < pid_max:
                with open("/proc/sys/kernel/pid_max", "w") as f:
                    f.write(str(pid_max))
    except (OSError, ValueError):
        pass


room_for_threads()


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

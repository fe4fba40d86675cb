"""Non-Distributed-Setup, the baseline: one process trains the shared problem to the bar."""

import numpy as np
import pytest

from support.examples import error_lines, run_train


def test_non_distributed_setup_trains_its_2000_steps_by_default(default_runs):
    # the bar, the metrics file and the checkpoints: test_examples_end_to_end.py
    assert default_runs["Non-Distributed-Setup"].summary()["global_step"] == "2000"


def test_a_rerun_with_the_same_log_dir_resumes_from_the_checkpoint(run_example, tmp_path):
    log_dir = str(tmp_path / "resume")
    first = run_example("Non-Distributed-Setup", "--steps", "300", log_dir=log_dir)
    assert first.code == 0 and first.summary()["global_step"] == "300", first.output[-3000:]
    second = run_example("Non-Distributed-Setup", "--steps", "500", log_dir=log_dir)
    assert "resuming from the checkpoint at global step 300" in second.output
    assert second.summary()["global_step"] == "500" and second.summary()["updates"] == "200"


def test_bad_input_gets_one_line_before_tensorflow_loads(tmp_path):
    code, _, stderr = run_train("Non-Distributed-Setup", ["--batch_size", "0"])
    assert code == 2 and error_lines(stderr) == stderr.splitlines() == [
        "error: --batch_size must be positive, got 0"], stderr


@pytest.mark.parametrize("content", [None, {"x_train": [1], "y_train": [1]}])
def test_a_missing_or_incomplete_data_file_is_reported_in_one_line(tmp_path, content):
    path = tmp_path / "mine.npz"
    if content is not None:  # an .npz without the test arrays
        np.savez(path, **content)
    code, _, stderr = run_train("Non-Distributed-Setup", [
        "--data_path", str(path), "--log_dir", str(tmp_path / "logs")])
    assert code == 2 and "Traceback" not in stderr and len(error_lines(stderr)) == 1, stderr
    line = error_lines(stderr)[0]
    assert line.startswith("error: cannot load %s (" % path), line
    assert line.endswith("): give an .npz with x_train, y_train, x_test and y_test"), line

"""benchmarks/compare.py: every example, one table and two plots, nothing left running."""
import os
import subprocess
import sys

import pytest

from conftest import EXAMPLES, ROOT, assert_nothing_left

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(900)  # eleven real runs
def test_compare_quick_writes_a_table_and_plots_that_list_every_example(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "compare.py"),
                           "--quick", "--out", str(out)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert "[1/" in proc.stderr  # progress: which run, how many
    table = (out / "results.md").read_text()
    for example in EXAMPLES:
        assert "| %s |" % example in table, example
    for name in ("accuracy.png", "scaling.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10000, name
    assert_nothing_left(str(tmp_path))


def test_compare_names_the_failed_example_and_its_log(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "compare.py"),
                           "--quick", "--out", str(out), "--batch_size", "0"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "compare: Non-Distributed-Setup with 1 worker(s) failed" in proc.stderr
    assert os.path.join(str(out), "logs", "Non-Distributed-Setup-w1-r0.log") in proc.stderr
    assert_nothing_left(str(tmp_path))

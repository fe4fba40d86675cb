"""Each example folder is self-contained, so the boilerplate is copied: keep the copies equal."""
import ast
import os
import re

import pytest

from conftest import DISTRIBUTED_EXAMPLES, EXAMPLES, example_dir

BLOCK = re.compile(r"^# >>> shared: (\S+)\n(.*?)^# <<< shared: \1$", re.S | re.M)
EVERY_TRAIN_PY = {"flags", "data", "model", "reporting"}
DISTRIBUTED_TRAIN_PY = EVERY_TRAIN_PY | {"cluster", "sessions", "shutdown"}
ALLOWED_IMPORTS = {"argparse", "collections", "json", "os", "socket", "sys", "threading", "time",
                   "numpy", "tensorflow", "sklearn"}


def shared_blocks(path):
    with open(path) as f:
        return dict(BLOCK.findall(f.read()))


def example_files(name):
    return {e: os.path.join(example_dir(e), name) for e in EXAMPLES}


def test_every_example_folder_has_train_py_run_sh_and_a_readme():
    for example in EXAMPLES:
        for name in ("train.py", "run.sh", "README.md"):
            assert os.path.isfile(os.path.join(example_dir(example), name)), (example, name)


def test_each_train_py_carries_the_shared_blocks_it_needs():
    for example, path in example_files("train.py").items():
        needed = DISTRIBUTED_TRAIN_PY if example in DISTRIBUTED_EXAMPLES else EVERY_TRAIN_PY
        assert needed <= set(shared_blocks(path)), (example, needed - set(shared_blocks(path)))


@pytest.mark.parametrize("file_name", ["train.py", "run.sh"])
def test_the_shared_blocks_are_the_same_text_in_every_example(file_name):
    copies = {}
    for example, path in example_files(file_name).items():
        for name, text in shared_blocks(path).items():
            copies.setdefault(name, {})[example] = text
    assert copies, "no shared blocks found in any %s" % file_name
    for name, by_example in copies.items():
        reference = by_example.get("Distributed-Setup", next(iter(by_example.values())))
        drifted = [e for e, text in by_example.items() if text != reference]
        assert not drifted, "shared block %r of %s differs from Distributed-Setup's in %s" % (
            name, file_name, drifted)


def test_every_distributed_run_sh_is_the_shared_launcher():
    for example in DISTRIBUTED_EXAMPLES:
        blocks = shared_blocks(os.path.join(example_dir(example), "run.sh"))
        assert {"label", "run.sh"} <= set(blocks), example


def test_train_py_imports_only_tensorflow_numpy_scikit_learn_and_the_standard_library():
    for example, path in example_files("train.py").items():
        with open(path) as f:
            tree = ast.parse(f.read())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, "%s imports relatively" % example
                imported.add(node.module.split(".")[0])
        assert imported <= ALLOWED_IMPORTS, (example, imported - ALLOWED_IMPORTS)

"""Copy the shared text from its reference file into every train.py (a maintainer's tool; the
tests only check that the copies are equal).

    python tools/sync_shared.py          # after editing a shared block in its reference file

The reference of the appendix (from the plumbing banner to the end) is, by the jobs a train.py
declares in JOBS: Distributed-Setup for ("ps", "worker"), ParameterServerStrategy for the other
TensorFlow 2 examples' jobs, Non-Distributed-Setup for (); and In-Graph-Replication for the
examples in ONE_CLIENT, whose one client drives every worker task (their JOBS, ("worker",), are
MultiWorkerMirroredStrategy's, so the name decides). The reference of a shared block above
the banner is the first file in REFERENCES that has it.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "deploy"))
import manifests  # noqa: E402  deploy/manifests.py: the one reader of a train.py's JOBS

BANNER = "# " + "=" * 98 + "\n# Plumbing shared by every example"
BLOCK = re.compile(r"^# >>> shared: (.+?)\n(.*?)^# <<< shared: \1$", re.S | re.M)
REFERENCES = ["Distributed-Setup", "ParameterServerStrategy", "Non-Distributed-Setup", "DOWNPOUR",
              "Sync-SGD"]


ONE_CLIENT = ("In-Graph-Replication", "Model-Parallel-Pipeline")  # worker 0 drives the others
# The examples, by name: a folder copied inside the repository (a user's own job, its Data and
# Model replaced) is none of them, so its sections are never written back to the MLP's
EXAMPLES = ("ADAG", "AEASGD", "DOWNPOUR", "DiLoCo", "Distributed-Setup", "DynSGD", "EAMSGD",
            "EASGD", "Evolution-Strategies", "Gradient-Compression", "Hogwild", "Keras-Fit",
            "In-Graph-Replication", "Model-Parallel-Pipeline", "MultiWorkerMirroredStrategy",
            "Non-Distributed-Setup", "ParameterServerStrategy", "Sparse-Embeddings",
            "Sparse-Embeddings-TF2", "Sync-SGD")


def family(jobs, example=""):
    """The reference example whose appendix a train.py carries, by its JOBS (and its name)."""
    if example in ONE_CLIENT:
        return "In-Graph-Replication"
    if jobs == ("ps", "worker"):
        return "Distributed-Setup"
    return "Non-Distributed-Setup" if jobs == () else "ParameterServerStrategy"


def main():
    if sys.argv[1:]:
        sys.exit("usage: python tools/sync_shared.py (it takes no arguments; see its docstring)")
    examples = sorted(EXAMPLES)
    texts = {e: open(os.path.join(ROOT, e, "train.py")).read() for e in examples}
    blocks = {}  # every shared block, above or below a banner: the first reference's text
    for e in REFERENCES + examples:
        for name, body in BLOCK.findall(texts[e]):
            blocks.setdefault(name, body)
    canonical = lambda text: BLOCK.sub(lambda m: "# >>> shared: %s\n%s# <<< shared: %s" % (
        m.group(1), blocks[m.group(1)], m.group(1)), text)
    changed = []
    for e in examples:
        text = texts[e]
        reference = texts[family(manifests.declared_jobs(os.path.join(ROOT, e, "train.py")), e)]
        new = canonical(text[:text.index(BANNER)] + reference[reference.index(BANNER):])
        if new != text:
            with open(os.path.join(ROOT, e, "train.py"), "w") as f:
                f.write(new)
            changed.append(e)
    print("updated: " + (", ".join(changed) or "nothing"))


if __name__ == "__main__":
    sys.exit(main())

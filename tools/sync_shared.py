"""Copy the shared blocks from their reference files into every train.py (a maintainer's tool;
the tests only check that the copies are equal).

    python tools/sync_shared.py          # after editing a shared block in its reference file

A shared block is the text between `# >>> shared: NAME` and `# <<< shared: NAME`. Each
train.py carries the blocks its own story calls, and only those: to give an example a block,
add the two marker lines where it goes (below the banner for the plumbing) and run this tool,
which fills it in. The reference of a block is the first file in REFERENCES that has it, else
the first example that has it. The banner's last line names the blocks of its file, in order;
this tool writes it.
"""
import os
import re
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BANNER = "# " + "=" * 98 + "\n# Plumbing shared by every example"
BLOCK = re.compile(r"^# >>> shared: (.+?)\n(.*?)^# <<< shared: \1$", re.S | re.M)
LISTING = re.compile(r"(this file's, in order:\n)(?:# .*\n)*?(?=# >>> shared: )")
REFERENCES = ["Distributed-Setup", "ParameterServerStrategy", "In-Graph-Replication",
              "Non-Distributed-Setup", "DOWNPOUR", "Sync-SGD"]

ONE_CLIENT = ("In-Graph-Replication", "Model-Parallel-Pipeline")  # worker 0 drives the others
# The examples, by name: a folder copied inside the repository (a user's own job, its Data and
# Model replaced) is none of them, so its sections are never written back to the MLP's
EXAMPLES = ("ADAG", "AEASGD", "DOWNPOUR", "DiLoCo", "Distributed-Setup", "DynSGD", "EAMSGD",
            "EASGD", "Evolution-Strategies", "Gradient-Compression", "Hogwild", "Keras-Fit",
            "In-Graph-Replication", "Model-Parallel-Pipeline", "MultiWorkerMirroredStrategy",
            "Non-Distributed-Setup", "ParameterServerStrategy", "Sparse-Embeddings",
            "Sparse-Embeddings-TF2", "Sync-SGD")


def family(jobs, example=""):
    """The family of a train.py, by its JOBS (and its name): the examples on a ps
    (Distributed-Setup's), TensorFlow 2's strategies (ParameterServerStrategy's), one client
    that drives every worker (In-Graph-Replication's) and the one process (Non-Distributed-Setup)."""
    if example in ONE_CLIENT:
        return "In-Graph-Replication"
    if jobs == ("ps", "worker"):
        return "Distributed-Setup"
    return "Non-Distributed-Setup" if jobs == () else "ParameterServerStrategy"


def synced(text, blocks):
    """text with every shared block's body replaced by its reference's, and the banner's list
    of this file's blocks written anew."""
    text = BLOCK.sub(lambda m: "# >>> shared: %s\n%s# <<< shared: %s" % (
        m.group(1), blocks[m.group(1)], m.group(1)), text)
    if BANNER not in text:
        return text
    names = [name for name, _ in BLOCK.findall(text[text.index(BANNER):])]
    listing = textwrap.wrap(", ".join(names) + ".", 98)
    return LISTING.sub(lambda m: m.group(1) + "".join("# %s\n" % l for l in listing), text, 1)


def main():
    if sys.argv[1:]:
        sys.exit("usage: python tools/sync_shared.py (it takes no arguments; see its docstring)")
    examples = sorted(EXAMPLES)
    texts = {e: open(os.path.join(ROOT, e, "train.py")).read() for e in examples}
    blocks = {}  # every shared block, above or below a banner: the first reference's text
    for e in REFERENCES + examples:
        for name, body in BLOCK.findall(texts[e]):
            if body.strip():  # (an empty block: one to fill in)
                blocks.setdefault(name, body)
    missing = {name for e in examples for name, _ in BLOCK.findall(texts[e])} - set(blocks)
    if missing:
        sys.exit("no file holds the text of the shared block(s) %s" % ", ".join(sorted(missing)))
    changed = []
    for e in examples:
        new = synced(texts[e], blocks)
        if new != texts[e]:
            with open(os.path.join(ROOT, e, "train.py"), "w") as f:
                f.write(new)
            changed.append(e)
    print("updated: " + (", ".join(changed) or "nothing"))


if __name__ == "__main__":
    sys.exit(main())

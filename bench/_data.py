"""The benches' real inputs: tests/data (gzipped, shipped with the repository) unpacked once; their
flags read in one way (``parse``, ``OneLineParser``)."""
import argparse
import gzip
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
VOCAB = os.path.join(DATA, "vocab.txt")


def unpacked(*parts):
    """Paths of tests/data/<parts...>/*.gz decompressed into a temporary directory (kept until exit)."""
    src = os.path.join(DATA, *parts)
    dst = tempfile.mkdtemp(prefix="bench_data_")
    out = []
    for name in sorted(os.listdir(src)):
        if name.endswith(".gz"):
            out.append(os.path.join(dst, name[:-3]))
            with gzip.open(os.path.join(src, name), "rb") as f, open(out[-1], "wb") as g:
                shutil.copyfileobj(f, g)
    import atexit
    atexit.register(shutil.rmtree, dst, True)
    return out


def golden_records(out, seq=512, pred=76, dupe_factor=10):
    """Records our generator makes from the golden input shard part-00000 (the reference's golden
    command at ``seq``/``pred``) into ``out``."""
    import subprocess
    src = [p for p in unpacked("golden", "input") if p.endswith("part-00000-of-00004")][0]
    subprocess.run([sys.executable, os.path.join(ROOT, "create_pretraining_data.py"), "--input_file=" + src,
                    "--output_file=" + out, "--vocab_file=" + VOCAB, "--do_lower_case=True", "--masked_lm_prob=0.15",
                    "--random_seed=12345", "--max_seq_length=%d" % seq, "--max_predictions_per_seq=%d" % pred,
                    "--dupe_factor=%d" % dupe_factor], check=True, capture_output=True)
    return out


def doc(path):
    """The docstring of the script at ``path``, read from its source: ``python -OO`` drops
    ``__doc__``, which the benches' ``--help`` and descriptions print."""
    import ast
    with open(path, encoding="utf-8") as f:
        return ast.get_docstring(ast.parse(f.read())) or ""


def parse(fv, argv, doc, required=()):
    """Parse a bench's flags (mlperf_bert.flags): ``--help`` prints its docstring, the usage line and
    every flag with its help and default, and exits 0, quietly where the reader went away
    (``--help | head``); an unknown flag is one line and exit 2."""
    from mlperf_bert import flags
    if any(a in ("--help", "-h", "--helpfull", "--helpshort") for a in list(argv)[1:]):
        try:
            print(doc.strip() + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            flags.quiet_stdout()
            raise SystemExit(0)
    return flags.parse(fv, argv, required, positional=False)


def count(text):
    """argparse type of a count flag: a whole number of 1 or more (0 or less ran nothing and
    ended in a traceback, or divided by it)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError("%r: give a whole number of 1 or more" % text)
    return n


def counts(flag, values, least=1):
    """The whole numbers of the comma-separated flag --``flag`` (a string or absl's list), at least
    one, each ``least`` or more; else a UserError naming the flag."""
    from mlperf_bert.errors import UserError
    items = [x.strip() for x in (values.split(",") if isinstance(values, str) else values)]
    try:
        out = [int(x) for x in items if x]
    except ValueError:
        out = []
    if not out or min(out) < least:
        raise UserError("--%s=%s: give comma-separated whole numbers of %d or more" % (flag, ",".join(items), least))
    return out


class OneLineParser(argparse.ArgumentParser):
    """argparse for the benches that use it: a bad flag is one line, ``error: PROG: MESSAGE``, exit 2
    (argparse printed its usage line first, two or more lines in all)."""

    def error(self, message):
        self.exit(2, "error: %s: %s\n" % (self.prog, message))

"""Time the text pipeline's steps on the vendored Wikipedia sample (tests/data/wiki_sample).

Prints, for one process: clean-up (cleanup_file.py + clean.sh rules), Punkt sentence
splitting (input lines/s and sentence lines/s written), and the whole ``text-pipeline``
with ``--workers`` processes.  Usage: .venv/bin/python bench/bench_text_pipeline.py [--workers=2]
"""
import glob
import gzip
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
import _data  # noqa: E402
from mlperf_bert import flags  # noqa: E402
from mlperf_bert.dataset import sentences, text_pipeline, wiki_cleanup  # noqa: E402


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_integer("workers", 2, "Processes of the whole text-pipeline run.", flag_values=fv)
    _data.parse(fv, argv, _data.doc(__file__))
    workers = fv.workers
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for src in sorted(glob.glob(os.path.join(ROOT, "tests", "data", "wiki_sample", "wiki_*.gz"))):
            path = os.path.join(tmp, os.path.basename(src)[:-3])
            with gzip.open(src, "rb") as f, open(path, "wb") as out:
                out.write(f.read())
            paths.append(path)
        raw = [text_pipeline.read_wiki_file(p) for p in paths]
        mb = sum(os.path.getsize(p) for p in paths) / 1e6

        t = time.perf_counter()
        cleaned = [wiki_cleanup.clean_text(r) for r in raw]
        dt_clean = time.perf_counter() - t
        lines = [line for c in cleaned for line in wiki_cleanup.universal_lines(c)]

        sentences._is_break.cache_clear()  # time it as a fresh worker would run
        t = time.perf_counter()
        out = sum(len(sentences.sent_tokenize(line)) for line in lines)
        dt_split = time.perf_counter() - t

        t = time.perf_counter()
        text_pipeline.run(paths, os.path.join(tmp, "out"), num_test_articles=22, workers=workers, progress=False)
        dt_all = time.perf_counter() - t
    print("input: %d WikiExtractor files, %.2f MB, %d cleaned lines" % (len(paths), mb, len(lines)))
    print("clean-up, 1 process: %.2f s (%.1f MB/s)" % (dt_clean, mb / dt_clean))
    print("Punkt, 1 process: %.2f s: %.0f input lines/s, %.0f sentence lines/s"
          % (dt_split, len(lines) / dt_split, out / dt_split))
    print("text-pipeline, %d workers: %.2f s (%.1f MB/s)" % (workers, dt_all, mb / dt_all))


if __name__ == "__main__":
    from mlperf_bert.cli import run_main
    run_main(main)

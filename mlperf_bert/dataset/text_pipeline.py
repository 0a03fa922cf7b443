"""``text-pipeline``: WikiExtractor output -> ``part-*`` text shards, ``eval.txt``, ``eval.md5``.

The reference's ``process_wiki.sh`` steps (``retired_benchmarks/bert/cleanup_scripts`` of
mlcommons/training), each as its script does it,
so that the outputs are byte for byte the reference's: clean-up (``cleanup_file.py`` and
``clean.sh``: wiki_cleanup), one sentence per line (``do_sentence_segmentation.py``: NLTK 3.4.5
Punkt, sentences), the seeded train/eval separation per input file (``seperate_test_set.py``),
then the training text gathered in sorted order into shards (``do_gather.py``).  Input files
are processed in a pool; only the gather is serial.

``.text_pipeline.json`` in the output directory names every file this command wrote there, so a
rerun with another shard count removes its own earlier shards and nothing else: files of the
names it writes that it did not write (downloaded official shards) make it refuse the directory.
It also says whether the last run finished: from its first output to its end it does not, so
``make-dataset`` refuses the shards of a run killed midway (``refuse_unfinished``).
"""
import glob
import math
import os
import random
import shutil

from mlperf_bert import flags
from mlperf_bert.dataset import run_record
from mlperf_bert.dataset.eval_articles import article_md5
from mlperf_bert.errors import UserError, worker_pool
from mlperf_bert.fileio import (atomic_open, check_writable_dir, new_dirs_removed_on_error, open_input,
                                refuse_overwriting_inputs, remove_stale_temporaries, special_kind, usable_cores)
from mlperf_bert.locking import lock_dir
from mlperf_bert.dataset.sentences import sent_tokenize
from mlperf_bert.dataset.wiki_cleanup import clean_text, universal_lines

MIB = 1024 * 1024
RECORD_NAME = ".text_pipeline.json"  # hidden: the directory otherwise holds what the reference makes
WORK_NAME = ".text_pipeline_work"
NUM_OUTPUTS = 500  # do_gather.py's --num_outputs: in every shard name, whatever the shard count


def read_wiki_file(path):
    """One WikiExtractor file's text (UTF-8, newlines untranslated: the clean-up translates them)."""
    try:
        with open_input(path, encoding="utf-8", newline="", fix="give WikiExtractor output files") as f:
            text = f.read()
    except UnicodeDecodeError:
        from mlperf_bert.fileio import compressed
        raise UserError(compressed(path) or "%s is not UTF-8 text: give WikiExtractor output files" % path)
    nul = text.find("\0")
    if nul >= 0:  # grep's binary-file rule: what the reference keeps depends on grep's version and buffers
        raise UserError("%s line %d holds a NUL character, which the reference's clean.sh (grep) takes for a "
                        "binary file and drops text of: remove it (tr -d '\\000'); WikiExtractor never writes one"
                        % (path, text.count("\n", 0, nul) + 1))
    if "<doc" not in text and text.strip():
        # not WikiExtractor output (the XML dump itself, notes a wide glob matched): cleaned as text,
        # its lines went into the shards and the eval set, exit 0. (An empty file is WikiExtractor's
        # for a dump of no article: no article, said as such.)
        raise UserError("%s holds no <doc ...> line, so it is not WikiExtractor output (the XML dump itself? run "
                        "wikiextractor on it first, docs/dataset.md section 3): narrow --wiki_glob to the "
                        "WikiExtractor files, e.g. 'text/*/wiki_??'" % path)
    return text


def segment_text(cleaned):
    """``do_sentence_segmentation.py`` on a cleaned file's text: the reference's ``.3`` file."""
    out = []
    for line in universal_lines(cleaned):
        if len(line) == 1:
            out.append("\n")
        # the line goes to Punkt with its newline, as the reference passes it
        out.extend(s.strip() + "\n" for s in sent_tokenize(line))
    out.append("\n")
    return "".join(out)


def segment_file(path):
    """The cleaned, sentence-per-line text of one WikiExtractor file (the reference's ``.3`` file)."""
    return segment_text(clean_text(read_wiki_file(path)))


def num_eval_articles(k, num_files, num_test_articles):
    """How many eval articles file ``k`` (0-based, sorted order) gives."""
    return int((k + 1) * num_test_articles * 1.0 / num_files) - int(k * num_test_articles * 1.0 / num_files)


def pick_eval_ids(num_articles, num_tests, seed):
    """The eval article ids of one file, in the order drawn."""
    rng = random.Random(seed)
    ids, chosen = [], set()
    while len(ids) < num_tests:
        new_id = int(rng.random() * num_articles)
        if new_id not in chosen:
            chosen.add(new_id)
            ids.append(new_id)
    return ids


class TooFewArticles(UserError):
    """A file with too few articles for its share of the eval articles; ``pieces``: its count of pieces."""


def separate(text, k, num_files, num_test_articles, seed, name="input"):
    """Split one segmented file's text into (training text, [eval articles]) as the reference does."""
    articles = text.split("\n\n")
    num_tests = num_eval_articles(k, num_files, num_test_articles)
    # The reference's count (with the piece after the last blank line, always blank, so never an
    # article): with fewer pieces it loops forever, with as many it picks them all and its
    # do_gather.py crashes (IndexError) on the file's empty training text.
    if num_tests >= len(articles):
        real = sum(1 for a in articles if a.strip())
        e = TooFewArticles("%s has %d article%s but must give %d eval article%s: give more input files or a "
                           "smaller --num_test_articles" % (name, real, "" if real == 1 else "s", num_tests,
                                                            "" if num_tests == 1 else "s"))
        e.pieces = len(articles)
        raise e
    chosen = set(pick_eval_ids(len(articles), num_tests, seed + 13 * k))
    train = "".join(a + "\n\n" for i, a in enumerate(articles) if i not in chosen)
    return train, [a for i, a in enumerate(articles) if i in chosen]


def largest_fitting(pieces, num_test_articles):
    """The largest count below ``num_test_articles`` every file gives its share of (``pieces[k]``: file k's
    count of pieces), or 0. Every file's: a share is a file's own, and a count that fits one file may not
    fit another (the sample's wiki_00 took 151, wiki_03 then refused it)."""
    n = len(pieces)
    # a share is at least count // n: larger counts cannot fit the smallest file
    top = min(num_test_articles - 1, n * min(pieces) - 1)
    # only a file with no more pieces than the largest share can refuse a count
    tight = [k for k in range(n) if pieces[k] <= -(-top // n)]
    return next((t for t in range(top, 0, -1) if all(num_eval_articles(k, n, t) < pieces[k] for k in tight)), 0)


def gather_piece(train):
    """What ``do_gather.py`` appends to a shard for one file's training text."""
    # It reads the text as utf-8-sig (a leading BOM goes) and drops one of two final newlines.
    if train.startswith("\ufeff"):
        train = train[1:]
    if train.endswith("\n\n"):
        train = train[:-1]
    return train


def _process_one(job):
    k, path, num_files, num_test_articles, seed, work_dir = job
    text = segment_file(path)
    try:
        train, evals = separate(text, k, num_files, num_test_articles, seed, path)
    except TooFewArticles as e:  # counted with every other file's: the count that fits them all (run)
        return None, e, e.pieces
    out = os.path.join(work_dir, "%08d.train" % k)
    with atomic_open(out, "w", encoding="utf-8", newline="\n") as f:
        f.write(gather_piece(train))
    return out, evals, text.count("\n\n") + 1


def gather_plan(sizes, block_size):
    """Groups of input indexes, as ``do_gather.py`` makes them from the RAW input files' sizes.

    A new group starts when the next input would take the group past ``block_size``; an input
    larger than a block makes a group of its own (the reference crashes when the first does).
    """
    groups, current, total = [], [], 0
    for i, size in enumerate(sizes):
        if current and total + size > block_size:
            groups.append(current)
            current, total = [], 0
        current.append(i)
        total += size
    if current:
        groups.append(current)
    return groups


def part_name(index):
    return "part-%05d-of-%05d" % (index, NUM_OUTPUTS)


def _is_output_name(name):
    return name in ("eval.txt", "eval.md5") or (name.startswith("part-") and "-of-" in name)


def _load_record(output_dir, fix="give an empty --output_dir"):
    """(names of the files text-pipeline runs wrote in ``output_dir``, whether the last run finished:
    None in an older version's record, which does not say); (empty, True) when none ran there.
    ``fix``: what a damaged record's error tells the user to do."""
    return run_record.load(output_dir, RECORD_NAME, "text-pipeline", _is_output_name, fix)


def read_record(output_dir):
    """The names of the files text-pipeline runs wrote in ``output_dir`` (empty if none did)."""
    return _load_record(output_dir)[0]


def write_record(output_dir, names, finished):
    run_record.write(output_dir, RECORD_NAME, names, finished)


def unfinished_run(text_dir):
    """(the names the record of ``text_dir`` lists, empty without one; why its files are not those of a
    finished text-pipeline run, with the fix (a phrase), or None). A folder no text-pipeline run wrote
    (the reference's scripts, downloaded shards) has no record and passes."""
    names, finished = _load_record(text_dir, "make the text shards again with text-pipeline into an empty "
                                             "--output_dir")
    if finished is None:  # an older version's record does not say: a killed run left its work folder
        finished = not os.path.isdir(os.path.join(text_dir, WORK_NAME))
    why = run_record.unfinished(text_dir, RECORD_NAME, names, finished)
    return names, ("an unfinished text-pipeline run: %s: rerun text-pipeline with the same flags to finish it" % why
                   if why else None)


def refuse_unfinished(text_dir, what="--text_dir"):
    """UserError when ``text_dir`` holds the outputs of a text-pipeline run that did not finish (killed,
    or stopped by an error) or lacks a file its run wrote: its shards would be taken for the whole
    text. Returns the names the record lists (empty without one)."""
    names, why = unfinished_run(text_dir)
    if why:
        raise UserError("%s %s holds %s" % (what, text_dir, why))
    return names


def refuse_foreign_outputs(output_dir, recorded):
    """A file named as an output that no text-pipeline run wrote (downloaded official shards) is
    neither overwritten nor removed: the run is refused."""
    if not os.path.isdir(output_dir):
        return
    foreign = sorted(n for n in os.listdir(output_dir) if _is_output_name(n) and n not in recorded)
    if foreign:
        shown = ", ".join(foreign[:3] + (["..."] if len(foreign) > 3 else []))
        raise UserError("--output_dir %s holds %d file(s) text-pipeline did not write (%s): give an empty "
                        "--output_dir; these are not removed or overwritten" % (output_dir, len(foreign), shown))


def write_eval(output_dir, eval_articles):
    with atomic_open(os.path.join(output_dir, "eval.txt"), "w", encoding="utf-8", newline="\n") as txt, \
            atomic_open(os.path.join(output_dir, "eval.md5"), "w", encoding="utf-8", newline="\n") as md5:
        for article in eval_articles:
            txt.write(article + "\n\n")
            md5.write(article_md5(article) + "\n")


def run(input_files, output_dir, num_test_articles=10000, block_size_mb=26.92, seed=12345, workers=None,
        progress=True):
    """Run the whole pipeline; return the list of part files written."""
    from mlperf_bert.progress import bar as progress_bar
    if not input_files:
        raise UserError("no input files: --wiki_glob matched nothing")
    input_files = sorted(input_files)
    check_writable_dir(os.path.join(output_dir, "eval.txt"))
    recorded = read_record(output_dir)
    # first: a killed run's part-00001-of-00500.tmp-PID would be taken for a shard it did not write
    remove_stale_temporaries(output_dir, sorted(recorded) + [RECORD_NAME])
    refuse_foreign_outputs(output_dir, recorded)
    groups = gather_plan([os.path.getsize(p) for p in input_files], block_size_mb * MIB)
    names = ["eval.txt", "eval.md5"] + [part_name(g) for g in range(len(groups))]
    work_dir = os.path.join(output_dir, WORK_NAME)
    os.makedirs(work_dir, exist_ok=True)
    n = len(input_files)
    jobs = [(k, p, n, num_test_articles, seed, work_dir) for k, p in enumerate(input_files)]
    workers = max(1, min(workers or usable_cores(), n))
    train_files, eval_articles, pieces, short = [], [], [], []
    try:
        with worker_pool(workers) as pool:
            for out, evals, count in progress_bar(pool.imap(_process_one, jobs), total=n, desc="clean+split",
                                          unit="file", disable=not progress):
                pieces.append(count)
                if out is None:
                    short.append(evals)
                    continue
                train_files.append(out)
                eval_articles.extend(evals)
        if short:  # the first file's line, and the count every file fits (one file's misled a rerun)
            fits = largest_fitting(pieces, num_test_articles)
            notes = (["%d other file%s too" % (len(short) - 1, "" if len(short) == 2 else "s")] if len(short) > 1
                     else []) + (["%d fits every file" % fits] if fits else [])
            raise UserError("%s%s" % (short[0], " (%s)" % "; ".join(notes) if notes else ""))
        # Before the first output (a killed run's files are ours too), not before: a run stopped
        # earlier has changed nothing, and the set an earlier run finished stays usable.
        write_record(output_dir, recorded | set(names), finished=False)
        write_eval(output_dir, eval_articles)
        parts = []
        for g, group in enumerate(progress_bar(groups, desc="gather", unit="shard", disable=not progress)):
            part = os.path.join(output_dir, part_name(g))
            with atomic_open(part, "wb") as fout:
                for i in group:
                    with open(train_files[i], "rb") as fin:
                        shutil.copyfileobj(fin, fout)
            parts.append(part)
        # A rerun with another shard count would leave the old set beside the new one, and
        # make-dataset takes every part-*: remove the earlier runs' shards (only those).
        for stale in sorted(recorded - set(names)):
            path = os.path.join(output_dir, stale)
            if os.path.exists(path):
                os.remove(path)
                print("text-pipeline: removed %s (written by an earlier run with another shard count)" % path)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    write_record(output_dir, names, finished=True)
    return parts


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_string("wiki_glob", None, "WikiExtractor output files, e.g. 'text/*/wiki_??'", flag_values=fv)
    flags.DEFINE_string("output_dir", None, "where part-*, eval.txt and eval.md5 go", flag_values=fv)
    flags.DEFINE_integer("num_test_articles", 10000, "articles held out for eval.txt", flag_values=fv)
    flags.DEFINE_float("block_size_mb", 26.92, "size of a text shard in MiB", flag_values=fv)
    flags.DEFINE_integer("seed", 12345, "base seed of the eval selection", flag_values=fv)
    flags.DEFINE_workers("processes (default: all cores)", flag_values=fv)
    flags.DEFINE_bool("progress", True, "show progress bars", flag_values=fv)
    flags.parse(fv, argv, required=["wiki_glob", "output_dir"], positional=False)
    files = sorted(glob.glob(os.path.expanduser(fv.wiki_glob)))
    # a link to a file that is gone (a disk not mounted) is a missing input, not a folder to skip:
    # left out, its articles were missing from the shards, and every file's eval share moved
    dangling = [f for f in files if not os.path.exists(f)]
    if dangling:
        raise UserError("--wiki_glob=%s matches %s, a link to a file that does not exist: restore the file, or "
                        "remove the link" % (fv.wiki_glob, dangling[0]))
    # so is a named pipe or a folder among the matches (skipped, its articles missing; the reference
    # opens each match: it waits on a pipe, fails on a folder)
    other = next((f for f in files if not os.path.isfile(f)), None)
    if other is not None:
        raise UserError("--wiki_glob=%s matches %s, %s, not a file: narrow the glob to the WikiExtractor files, e.g. "
                        "'text/*/wiki_??'" % (fv.wiki_glob, other, "a directory" if os.path.isdir(other)
                                              else special_kind(other) or "not a regular file"))
    if not files:
        raise UserError("--wiki_glob=%s matches no file: give the WikiExtractor output, e.g. 'text/*/wiki_??'"
                        % fv.wiki_glob)
    if not (math.isfinite(fv.block_size_mb) and fv.block_size_mb > 0):  # nan slipped past a `<= 0` test
        raise UserError("--block_size_mb=%s: give a finite shard size in MiB > 0 (the reference's: 26.92)"
                        % fv.block_size_mb)
    if fv.num_test_articles < 0:
        raise UserError("--num_test_articles=%d: give a count >= 0" % fv.num_test_articles)
    outputs = glob.glob(os.path.join(glob.escape(fv.output_dir), "part-*-of-*")) + [
        os.path.join(fv.output_dir, n) for n in ("eval.txt", "eval.md5")]
    refuse_overwriting_inputs(outputs, files)
    # What only reading the files finds (a file not UTF-8, a NUL, too few articles) refuses the run
    # after its lock made --output_dir: the folder goes again if this run made it.
    with new_dirs_removed_on_error(fv.output_dir), lock_dir(fv.output_dir, "--output_dir"):
        parts = run(files, fv.output_dir, fv.num_test_articles, fv.block_size_mb, fv.seed, fv.workers,
                    progress=fv.progress)
    print("wrote %d text shards, eval.txt and eval.md5 to %s" % (len(parts), fv.output_dir))
    return 0

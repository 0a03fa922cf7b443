"""``make-dataset``: text shards -> every TFRecord of the training set, plus eval_10k.

Each ``part-*`` text shard becomes a TFRecord of the same name, and ``eval.txt`` becomes
``eval_intermediate`` then ``eval_10k``, all with the standard command of the reference README
(mlcommons/training retired_benchmarks/bert/README.md: seq 512, 76 predictions, dupe 10,
seed 12345; each shard run on its own with the same seed). Shards run in a process pool. Every output is written under a temporary
name and renamed when complete, so a killed run leaves only finished outputs and a rerun
with the same flags produces the rest. At the end ``manifest.tsv`` lists name, bytes,
records and md5 of every output; ``verify`` checks a directory against it.
"""
import contextlib
import os
import re
import shlex
import sys
import time

from mlperf_bert import flags
from mlperf_bert.dataset.checksums import MANIFEST_NAME, OUTPUT_NAME, SETTINGS_NAME, read_manifest, write_manifest
from mlperf_bert.errors import UserError, worker_pool
from mlperf_bert.dataset.eval_samples import pick_eval_samples
from mlperf_bert.fileio import (check_writable_dir, file_md5, load_json, md5_many, new_dirs_removed_on_error,
                                open_input, refuse_overwriting_inputs, remove_stale_temporaries, usable_cores,
                                write_json)
from mlperf_bert.locking import lock_dir, remove_stale_locks
from mlperf_bert.dataset.pretraining_data import check_settings, create_pretraining_data
from mlperf_bert.dataset.tokenization import load_vocab
from mlperf_bert.dataset.vocab import VOCAB_MD5, refuse_special_vocab
from mlperf_bert.dataset.tfrecord import count_records, read_records

STANDARD = dict(do_lower_case=True, max_seq_length=512, max_predictions_per_seq=76, masked_lm_prob=0.15,
                random_seed=12345, dupe_factor=10, short_seq_prob=0.1)
_PART = re.compile(r"^part-\d+-of-\d+\Z")  # \Z: "$" also matches before a final newline


def find_text_shards(text_dir):
    """The sorted ``part-*`` text shards of ``text_dir`` and its ``eval.txt`` (or None); the
    shards of a text-pipeline run that did not finish are refused."""
    from mlperf_bert.dataset.text_pipeline import refuse_unfinished
    if not os.path.isdir(text_dir):
        raise UserError("--text_dir=%s is not a directory: give the directory of part-* text shards" % text_dir)
    pipeline_wrote = refuse_unfinished(text_dir)
    parts = sorted(n for n in os.listdir(text_dir) if _PART.match(n))
    for name in parts:
        if not os.path.isfile(os.path.join(text_dir, name)):
            raise UserError("%s is not a file: a text shard is a file; remove it or give the directory of the "
                            "text shards" % os.path.join(text_dir, name))
    if not parts:
        packed = sorted(n for n in os.listdir(text_dir) if _PART.match(n.rsplit(".", 1)[0])
                        and n.endswith((".gz", ".bz2", ".xz", ".zst")))
        if packed:
            tool = {"gz": "gunzip", "bz2": "bunzip2", "xz": "unxz", "zst": "unzstd"}[packed[0].rsplit(".", 1)[1]]
            raise UserError("%s holds compressed text shards (%s%s): decompress them first (e.g. %s %s)"
                            % (text_dir, packed[0], ", ..." if len(packed) > 1 else "", tool,
                               os.path.join(text_dir, "part-*")))
        raise UserError("%s holds no part-XXXXX-of-XXXXX text shard: give the text-pipeline output "
                        "or the downloaded results4/ directory" % text_dir)
    _check_one_set(text_dir, parts, pipeline_wrote)
    return [os.path.join(text_dir, p) for p in parts], find_eval_txt(text_dir)


def find_eval_txt(text_dir):
    """``text_dir``'s eval.txt, or None when there is none or it is empty (``text-pipeline
    --num_test_articles=0`` writes it so: it was refused as a shard of no document, and no
    TFRecord was made). One that is there but cannot be read (a link to a disk not mounted, a
    folder) is refused: it was taken for none, and the run "finished" without the eval set."""
    eval_txt = os.path.join(text_dir, "eval.txt")
    if not os.path.lexists(eval_txt):
        return None
    if not os.path.isfile(eval_txt):
        raise UserError("%s is %s: restore the file, or remove it to make the training TFRecords alone" % (
            eval_txt, "a link to a file that does not exist" if not os.path.exists(eval_txt) else "not a file"))
    return eval_txt if os.path.getsize(eval_txt) else None


def _check_one_set(text_dir, parts, pipeline_wrote):
    """Shards of two sets (``-of-00004`` beside ``-of-00002``) are refused; a set with shards missing
    is said (a partial download, or a sample taken on purpose), unless text-pipeline wrote the folder:
    a small text makes fewer shards than its names' total."""
    totals = sorted({int(n.rsplit("-of-", 1)[1]) for n in parts})
    if len(totals) > 1:
        raise UserError("%s holds text shards of %d sets (part-*-of-%s): make-dataset takes every part-* of one "
                        "set; move the other set's shards to a folder of their own" % (
                            text_dir, len(totals), ", -of-".join("%05d" % t for t in totals)))
    indexes = {int(n.split("-")[1]) for n in parts}
    missing = [i for i in range(totals[0]) if i not in indexes]
    if missing and not pipeline_wrote:
        shown = ", ".join("part-%05d-of-%05d" % (i, totals[0]) for i in missing[:3]) + (", ..." if len(missing) > 3
                                                                                       else "")
        print("warning: make-dataset: %s holds %d of the %d text shards part-*-of-%05d (missing: %s): the TFRecords "
              "made are a part of the set" % (text_dir, len(parts), totals[0], totals[0], shown),
              file=sys.stderr, flush=True)


def output_stats(path, check=False):
    """(bytes, records, md5) of one finished output; ``check``: each record's data CRC too."""
    records = sum(1 for _ in read_records(path, verify=True)) if check else count_records(path)
    return os.path.getsize(path), records, file_md5(path)


def eval_count_error(path, total, num_eval):
    return UserError("%s has %d records, fewer than --num_eval_examples=%d: rerun with --num_eval_examples=%d "
                     "or fewer (the MLPerf eval set is 10,000 records from the full eval.txt); finished outputs "
                     "are kept" % (path, total, num_eval, total))


def _run_job(job):
    """Produce one output unless it already exists; return its manifest rows. An output an earlier
    run made is checked first (each record's CRC, and the size and md5 the manifest gave it),
    since its row is written again: a file damaged since would be listed as made, and `verify`
    would pass it."""
    kind, src, out_dir, settings, num_eval, listed = job
    t0 = time.time()
    made = set()
    if kind == "part":
        out = os.path.join(out_dir, os.path.basename(src))
        if not os.path.exists(out):
            create_pretraining_data([src], [out], progress=False, **settings)
            made.add(out)
        outs = [out]
    else:
        inter = os.path.join(out_dir, "eval_intermediate")
        final = os.path.join(out_dir, "eval_10k")
        if not os.path.exists(final):
            if not os.path.exists(inter):
                create_pretraining_data([src], [inter], progress=False, **settings)
                made.add(inter)
            total = count_records(inter)
            if total < num_eval:
                raise eval_count_error(inter, total, num_eval)
            pick_eval_samples(inter, final, num_eval, settings["max_seq_length"],
                              settings["max_predictions_per_seq"], progress=False)
            made.add(final)
        # eval_intermediate is only eval_10k's source: one deleted since (843 MB) is not needed again
        outs = [inter, final] if os.path.exists(inter) else [final]
    try:
        rows = [(os.path.basename(p),) + output_stats(p, check=p not in made) for p in outs]
        for p, (name, size, records, md5) in zip(outs, rows):
            # the generator writes no empty output (an input with no document is refused) and eval_10k
            # holds num_eval records: an output that does not was not made by this run's settings
            if not records or name == "eval_10k" and records != num_eval:
                raise UserError("%s holds %d records%s" % (p, records, "" if not records else
                                                            ", not --num_eval_examples=%d" % num_eval))
            if p not in made and name in listed and listed[name] != (size, md5):
                raise UserError("%s is %d bytes with md5 %s, but %s gave it %d bytes and md5 %s" % (
                    p, size, md5, MANIFEST_NAME, listed[name][0], listed[name][1]))
    except UserError as e:  # one a run made (it is never written in place): damaged since
        raise UserError("%s; make-dataset remakes an output only when it is missing: delete the damaged file and "
                        "rerun" % e)
    return src, rows, time.time() - t0


def _outputs_of(src):
    """The outputs made from input ``src`` (a text shard or eval.txt)."""
    name = os.path.basename(src)
    return ["eval_intermediate", "eval_10k"] if name == "eval.txt" else [name]


# A write within the clock tick of a recorded stat leaves the size and mtime as they were (ticks of
# 1-2 s on FAT, SMB, some NFS servers): a recorded md5 stands only for a file last written this long
# before it was hashed (git's "racy" rule)
RACY_NS = 2 * 10 ** 9


def input_stats(paths, old_inputs, workers=None):
    """``{name: {"bytes", "mtime_ns", "hashed_ns", "md5"}}`` of the inputs. An input whose size and
    mtime are those recorded keeps its recorded md5, unless it was written within ``RACY_NS`` of that
    hash; the others are hashed (in threads: hashlib releases the GIL), so a rerun reads only what
    was touched and a content change of the same size is seen."""
    stats, to_hash = {}, []
    for p in paths:
        now = time.time_ns()  # before the stat: the hash is of the file at this time or later
        st = os.stat(p)
        name = os.path.basename(p)
        stats[name] = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
        old = old_inputs.get(name)
        if isinstance(old, dict) and old.get("md5") and (old.get("bytes"), old.get("mtime_ns")) == (
                st.st_size, st.st_mtime_ns) and isinstance(old.get("hashed_ns"), int) and \
                old["hashed_ns"] - st.st_mtime_ns >= RACY_NS:
            stats[name].update(md5=old["md5"], hashed_ns=old["hashed_ns"])
        else:
            stats[name]["hashed_ns"] = now
            to_hash.append(p)
    for p, digest in md5_many(to_hash, workers and min(workers, 32), progress=False).items():
        stats[os.path.basename(p)]["md5"] = digest
    return stats


def read_settings(out_dir):
    """The settings recorded in ``out_dir`` (None when there are none)."""
    path = os.path.join(out_dir, SETTINGS_NAME)
    if not os.path.exists(path):
        return None
    try:
        with open_input(path, encoding="utf-8", fix="delete it only if %s holds no outputs" % out_dir) as f:
            settings = load_json(f)
    except (OSError, ValueError) as e:
        raise UserError("cannot read %s (%s): delete it only if %s holds no outputs" % (path, e, out_dir))
    inputs = settings.get("inputs", {}) if isinstance(settings, dict) else None
    # (null read as "no settings" let a rerun with other flags add to the outputs of these)
    if not isinstance(inputs, dict) or not all(isinstance(v, (dict, int)) for v in inputs.values()):
        raise UserError("%s is not the settings make-dataset writes (a JSON object, its inputs by name): delete "
                        "it only if %s holds no outputs, else use a new --output_dir" % (path, out_dir))
    return settings


def _input_change(name, old, new):
    """How input ``name`` differs from what was recorded when its output was made, or None."""
    if old is None:
        return "input %s was not recorded" % name
    if not isinstance(old, dict):  # recorded before md5s were: the size alone
        old = {"bytes": old}
    if old.get("bytes") != new["bytes"]:
        return "input %s is %d bytes (was %s)" % (name, new["bytes"], old.get("bytes"))
    if old.get("md5") and old["md5"] != new["md5"]:
        return "input %s changed (md5 %s, was %s; same size)" % (name, new["md5"], old["md5"])
    return None


def _identity(record):
    """``record`` without its inputs' mtimes and hash times, which only say when to hash again and
    change where no input did (a copy without its times: cp -r, rsync without -t; a touch)."""
    inputs = record.get("inputs") if isinstance(record, dict) else None
    if not isinstance(inputs, dict):
        return record
    return dict(record, inputs={n: {k: v for k, v in i.items() if k not in ("mtime_ns", "hashed_ns")}
                                if isinstance(i, dict) else i for n, i in inputs.items()})


def _check_settings(out_dir, old, record):
    """Refuse a resume that would mix settings, before anything is written; then record ``record``.

    Each output is compared only with what it depends on, and only if it exists: every output on
    the flags and the vocab's md5, a TFRecord on its input's size and md5, eval_10k also on
    --num_eval_examples. So a run stopped by bad input or a too large --num_eval_examples can be
    corrected and rerun, and nothing made from one vocab, text or setting is mixed with another.
    """
    exists = lambda name: os.path.exists(os.path.join(out_dir, name))  # noqa: E731
    if old is None:  # no make-dataset run recorded here: an output present was made otherwise, and is kept
        foreign = [o for n in sorted(record["inputs"]) for o in _outputs_of(n) if exists(o)]
        if foreign:
            shown = ", ".join(foreign[:3] + (["..."] if len(foreign) > 3 else []))
            raise UserError("--output_dir %s holds %d output(s) of no make-dataset run (%s; no %s): they are not "
                            "remade, so settings could mix; use a new --output_dir (`verify` checks downloaded "
                            "files)" % (out_dir, len(foreign), shown, SETTINGS_NAME))
    if old is not None and _identity(old) != _identity(record):
        made = [n for n in record["inputs"] if any(exists(o) for o in _outputs_of(n))]
        diffs = []
        if made:
            diffs = ["%s=%s (was %s)" % (k, record.get(k), old.get(k))
                     for k in sorted(set(old) | set(record))
                     if k not in ("inputs", "num_eval_examples") and old.get(k) != record.get(k)]
        if exists("eval_10k") and old.get("num_eval_examples") != record["num_eval_examples"]:
            diffs.append("num_eval_examples=%s (was %s)" % (record["num_eval_examples"], old.get("num_eval_examples")))
        old_inputs = old.get("inputs") or {}
        diffs += [d for d in (_input_change(n, old_inputs.get(n), record["inputs"][n]) for n in made) if d]
        if diffs:
            shown = ", ".join(diffs[:4] + (["..."] if len(diffs) > 4 else []))
            raise UserError("%s was started with other settings: %s; rerun with the same flags and inputs or use "
                            "a new --output_dir" % (out_dir, shown))
    inter, final = (os.path.join(out_dir, n) for n in ("eval_intermediate", "eval_10k"))
    if os.path.exists(inter) and not os.path.exists(final):  # refused now, not after the other shards
        total = count_records(inter)
        if total < record["num_eval_examples"]:
            raise eval_count_error(inter, total, record["num_eval_examples"])
    if _identity(old) != _identity(record):  # accepted: only now is anything written
        # the manifest says the recorded run finished: one of other settings (inputs added) would
        # let a run of these stopped before its end pass `verify` as the last one's finished set
        manifest = os.path.join(out_dir, MANIFEST_NAME)
        if os.path.lexists(manifest):
            os.remove(manifest)
        write_json(os.path.join(out_dir, SETTINGS_NAME), record, indent=1, sort_keys=True)
    elif old != record:  # inputs hashed again (input_stats), the same bytes: the manifest stands
        write_json(os.path.join(out_dir, SETTINGS_NAME), record, indent=1, sort_keys=True)


def _refuse_orphans(output_dir, text_dir, outputs):
    """An output of --output_dir made from no input of --text_dir (its shard removed or renamed since)
    would be left out of the manifest, yet a trainer given part-* reads it: refused, before anything
    is written."""
    orphans = sorted(n for n in os.listdir(output_dir) if OUTPUT_NAME.match(n) and n not in outputs) \
        if os.path.isdir(output_dir) else []
    if orphans:
        shown = ", ".join(orphans[:3] + (["..."] if len(orphans) > 3 else []))
        raise UserError("--output_dir %s holds %s, made from no input of --text_dir %s (%s): delete %s or restore "
                        "the input, then rerun" % (output_dir, shown, text_dir, "removed or renamed since?",
                                                   "them" if len(orphans) > 1 else "it"))


def make_dataset(text_dir, output_dir, vocab_file, workers=None, num_eval_examples=10000, progress=True,
                 **overrides):
    """Generate every output (skipping finished ones), write the manifest, return its rows."""
    settings = dict(STANDARD, **overrides)
    settings["vocab_file"] = os.path.abspath(vocab_file)
    if os.path.isdir(vocab_file):
        raise UserError("--vocab_file=%s is a directory: give the path of vocab.txt" % vocab_file)
    refuse_special_vocab(vocab_file)  # (a named pipe is no regular file: it was called missing)
    if not os.path.isfile(vocab_file):
        raise UserError("--vocab_file=%s does not exist: run `python -m mlperf_bert fetch-vocab --output=%s` "
                        "or give the path of vocab.txt" % (vocab_file, shlex.quote(vocab_file)))
    parts, eval_txt = find_text_shards(text_dir)
    if os.path.realpath(output_dir) == os.path.realpath(text_dir):
        raise UserError("--output_dir is --text_dir: the TFRecords take the text shards' names, give another "
                        "--output_dir")
    if num_eval_examples < 1:
        raise UserError("--num_eval_examples=%d must be at least 1" % num_eval_examples)
    # Validate everything a worker would before anything is written (settings file included).
    check_settings(settings["max_seq_length"], settings["max_predictions_per_seq"], settings["masked_lm_prob"],
                   settings["dupe_factor"], settings["short_seq_prob"])
    load_vocab(vocab_file)
    inputs = parts + ([eval_txt] if eval_txt else [])
    names = [os.path.basename(p) for p in parts] + ["eval_intermediate", "eval_10k", MANIFEST_NAME,
                                                   SETTINGS_NAME]
    refuse_overwriting_inputs([os.path.join(output_dir, n) for n in names], inputs + [vocab_file])
    # A shard refused once read (no document, not text), stopped before any output was finished:
    # the settings this run recorded and the folders it made go again, so nothing new is left.
    with new_dirs_removed_on_error(output_dir):
        check_writable_dir(os.path.join(output_dir, MANIFEST_NAME))
        lock = lock_dir(output_dir, "--output_dir")
        settings_path = os.path.join(output_dir, SETTINGS_NAME)
        had_settings = os.path.lexists(settings_path)
        try:
            _refuse_orphans(output_dir, text_dir, {o for p in inputs for o in _outputs_of(p)})
            old = read_settings(output_dir)
            record = dict(settings, vocab_file=os.path.basename(vocab_file), vocab_md5=file_md5(vocab_file),
                          num_eval_examples=num_eval_examples,
                          inputs=input_stats(inputs, (old or {}).get("inputs") or {}, workers))
            if record["vocab_md5"] != VOCAB_MD5:  # a vocab of one's own may be the point; but say it
                print("warning: make-dataset: --vocab_file=%s has md5 %s, not the MLPerf vocab's %s: the records "
                      "will not be the reference's (`python -m mlperf_bert fetch-vocab --output=vocab.txt` gets "
                      "it)" % (vocab_file, record["vocab_md5"], VOCAB_MD5), file=sys.stderr, flush=True)
            return _make(parts, eval_txt, output_dir, settings, num_eval_examples, workers, progress, names, old,
                         record)
        except Exception:
            # a refusal or a failure: finished outputs are kept, and the settings that guard their
            # resume with them. A stop (a signal) keeps the settings too: they hold every input's md5,
            # which the rerun would otherwise read all the shards again for (docs/dataset.md)
            if not had_settings and not any(os.path.lexists(os.path.join(output_dir, n)) for n in names
                                            if n != SETTINGS_NAME):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(settings_path)
            raise
        finally:
            # a generator ended by the pool's terminate (an error, a signal) may not have removed its
            # lock file: the workers are gone here, so no lock is left behind either way
            remove_stale_locks(output_dir, names)
            lock.release()


def _make(parts, eval_txt, output_dir, settings, num_eval_examples, workers, progress, names, old, record):
    from mlperf_bert.progress import bar as progress_bar
    remove_stale_temporaries(output_dir, names)
    remove_stale_locks(output_dir, names)  # per-file locks of a killed run's generators
    try:  # what the last finished run listed (written again at the end, so not needed whole)
        listed = read_manifest(os.path.join(output_dir, MANIFEST_NAME))
    except (UserError, OSError):
        listed = {}
    _check_settings(output_dir, old, record)

    def rows_of(src):
        return {n: listed[n] for n in _outputs_of(src) if n in listed}
    jobs = [("part", p, output_dir, settings, None, rows_of(p)) for p in parts]
    if eval_txt:
        # The eval text is the largest input: start it first so it does not finish last alone.
        jobs.insert(0, ("eval", eval_txt, output_dir, settings, num_eval_examples, rows_of(eval_txt)))
    sizes = {j[1]: os.path.getsize(j[1]) for j in jobs}
    workers = max(1, min(workers or usable_cores(), len(jobs)))
    rows = []
    with progress_bar(total=sum(sizes.values()), unit="B", unit_scale=True, desc="make-dataset",
              disable=not progress, smoothing=0.05) as bar:
        with worker_pool(workers) as pool:
            for src, out_rows, _ in pool.imap_unordered(_run_job, jobs):
                rows += out_rows
                bar.update(sizes[src])
    rows.sort()
    write_manifest(os.path.join(output_dir, MANIFEST_NAME), rows)
    return rows


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_string("text_dir", None, "directory of part-* text shards (and eval.txt)", flag_values=fv)
    flags.DEFINE_string("output_dir", None, "where the TFRecords and manifest.tsv go", flag_values=fv)
    flags.DEFINE_string("vocab_file", None, "vocab.txt (`python -m mlperf_bert fetch-vocab --output=vocab.txt` "
                        "gets it)", flag_values=fv)
    flags.DEFINE_workers("processes (default: all cores)", flag_values=fv)
    flags.DEFINE_integer("num_eval_examples", 10000, "records picked from eval_intermediate into eval_10k",
                         flag_values=fv)
    flags.DEFINE_integer("max_seq_length", STANDARD["max_seq_length"], "override for tests", flag_values=fv)
    flags.DEFINE_integer("max_predictions_per_seq", STANDARD["max_predictions_per_seq"], "override for tests",
                         flag_values=fv)
    flags.DEFINE_integer("dupe_factor", STANDARD["dupe_factor"], "override for tests", flag_values=fv)
    flags.DEFINE_integer("random_seed", STANDARD["random_seed"], "override for tests", flag_values=fv)
    flags.DEFINE_bool("progress", True, "show a progress bar", flag_values=fv)
    flags.parse(fv, argv, required=["text_dir", "output_dir", "vocab_file"], positional=False)
    rows = make_dataset(fv.text_dir, fv.output_dir, fv.vocab_file, fv.workers, fv.num_eval_examples,
                        fv.progress, max_seq_length=fv.max_seq_length,
                        max_predictions_per_seq=fv.max_predictions_per_seq, dupe_factor=fv.dupe_factor,
                        random_seed=fv.random_seed)
    print("wrote %d outputs (%d records) and %s to %s" % (
        len(rows), sum(r[2] for r in rows), MANIFEST_NAME, fv.output_dir))
    if not any(r[0] == "eval_10k" for r in rows):
        print("note: %s %s, so eval_intermediate and eval_10k were not made" % (
            fv.text_dir, "has an empty eval.txt" if os.path.lexists(os.path.join(fv.text_dir, "eval.txt"))
            else "has no eval.txt"))
    return 0

"""A command's record, in its output folder, of the files its runs wrote there and whether the last
run finished: ``text-pipeline``'s ``.text_pipeline.json``, ``pack``'s ``.pack.json``.

A run writes it unfinished before its first output and finished at its end, so a run killed
midway (SIGKILL, a crash: nothing else can say so) leaves files, each complete, that the readers
of the folder refuse rather than take for the whole set. A folder without a record (no run of the
command wrote it, or an older version's) is taken as it is.
"""
import os

from mlperf_bert.errors import UserError
from mlperf_bert.fileio import load_json, write_json


def load(directory, record_name, command, is_output, fix):
    """(names of the files the command's runs wrote in ``directory``, whether the last run finished:
    None in a record that does not say); (empty, True) without a record. ``is_output(name)``: whether
    the command writes a file of that name; ``fix``: what a damaged record's error tells the user to do."""
    path = os.path.join(directory, record_name)
    if not os.path.exists(path):
        return set(), True
    try:
        with open(path, encoding="utf-8") as f:
            record = load_json(f)
        names, finished = record["outputs"], record.get("finished")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UserError("cannot read %s (%s): %s" % (path, e, fix))
    # a rerun of text-pipeline removes the files it names: only the command's own names, in this folder
    bad = [n for n in names if not isinstance(n, str) or os.path.basename(n) != n or not is_output(n)] \
        if isinstance(names, list) else [names]
    if bad:
        raise UserError("%s names %r, not a file %s writes in %s: %s (nothing it names is removed)"
                        % (path, bad[0], command, directory, fix))
    return set(names), finished if isinstance(finished, bool) else None


# make-dataset's own record: its settings, written before its first output, and its manifest, written last
MAKE_DATASET_SETTINGS, MAKE_DATASET_MANIFEST = "make_dataset_settings.json", "manifest.tsv"


def unfinished_make_dataset(directory):
    """Why ``directory`` is the folder of a make-dataset run that has not finished (a phrase), or None."""
    if os.path.isfile(os.path.join(directory, MAKE_DATASET_SETTINGS)) and \
            not os.path.exists(os.path.join(directory, MAKE_DATASET_MANIFEST)):
        return ("make-dataset's folder, with its %s but no %s, which it writes when it is done: a run that did not "
                "finish, or is running; rerun the same make-dataset command to finish it"
                % (MAKE_DATASET_SETTINGS, MAKE_DATASET_MANIFEST))
    return None


def write(directory, record_name, names, finished):
    write_json(os.path.join(directory, record_name), {"outputs": sorted(names), "finished": finished}, indent=1)


def unfinished(directory, record_name, names, finished):
    """Why the files of ``directory`` are not those of a finished run (a phrase), or None: its record
    (``names``, ``finished``, as ``load`` read them) says the last run did not finish, or a file it
    lists is missing."""
    missing = sorted(n for n in names if not os.path.exists(os.path.join(directory, n)))
    if missing:
        shown = ", ".join(missing[:3] + (["..."] if len(missing) > 3 else []))
        return "%d of the %d files its record %s lists are missing (%s)" % (len(missing), len(names), record_name,
                                                                           shown)
    if not finished:
        return "its record %s says its last run did not finish (its files may mix two runs)" % record_name
    return None

"""``verify``: check files or directories against the known md5 sums and sizes in results/.

A file is found by its name, or else by its content (its size and md5 are a published file's:
configs/bert_config_large.json is the reference's bert_config.json). A file with no published value
is checked against the checksums it carries, where it has them: an HDF5 or packed file (to-hdf5,
pack) against each dataset's CRC-32C, a TFRecord against its records' CRCs; one damaged where its
kind shows (still laid out as TFRecords, or named ``.tfrecord``/``.hdf5``) is a ``MISMATCH``; only
a file with neither is ``UNKNOWN``. A manifest written by ``make-dataset`` (``manifest.tsv``) is
used too (its names are files of its own folder): as a path, it checks the files beside it; a
directory that holds one is checked against it; as ``--manifest=FILE``, it checks the given
directories against it, so two sites can compare regenerated datasets by md5. A mismatch says what differs (bytes or md5, and who lists the other
value); the last line counts the verdicts.
"""
import hashlib
import os
import re
import shlex

from mlperf_bert import flags
from mlperf_bert.errors import UserError, escaped
from mlperf_bert.fileio import atomic_open, md5_many, open_input, read_lines, unfinished_download, unfinished_write
from mlperf_bert.locking import is_lock_file
from mlperf_bert.dataset import hdf5, packing, run_record
from mlperf_bert.dataset.eval_articles import check_eval_articles
from mlperf_bert.dataset.tfrecord import _U32, masked_crc32c, read_records, refuse_special_file

RESULTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "results")
# make-dataset writes its settings first, its manifest last
SETTINGS_NAME, MANIFEST_NAME = run_record.MAKE_DATASET_SETTINGS, run_record.MAKE_DATASET_MANIFEST
MANIFEST_HEADER = "name\tbytes\trecords\tmd5"
NUM_PARTS = 500
PART_NAMES = ["part-%05d-of-%05d" % (i, NUM_PARTS) for i in range(NUM_PARTS)]
OUTPUT_NAME = re.compile(r"^(part-\d+-of-\d+|eval_intermediate|eval_10k)\Z")  # make-dataset's outputs

# set name -> (md5 table file, size table file or None, names every complete set holds)
SETS = {
    "text": ("bert_reference_results_text_md5.txt", "bert_reference_results_text_sizes.txt",
             PART_NAMES + ["eval.txt", "eval.md5"]),
    "tfrecord": (None, "bert_reference_tfrecord_sizes.txt",
                 PART_NAMES + ["eval_intermediate", "eval_10k"]),
    "checkpoint_tf1": ("bert_reference_checkpoint_tf1_md5.txt", "bert_reference_checkpoint_tf1_sizes.txt",
                       ["model.ckpt-28252.index", "model.ckpt-28252.meta",
                        "model.ckpt-28252.data-00000-of-00001"]),
    "checkpoint_tf2": ("bert_reference_checkpoint_tf2_md5.txt", "bert_reference_checkpoint_tf2_sizes.txt",
                       ["model.ckpt-28252.index", "model.ckpt-28252.data-00000-of-00001"]),
    "dump": ("bert_reference_dump_md5.txt", "bert_reference_dump_sizes.txt", []),
}
SET_NAMES = frozenset(n for _, _, names in SETS.values() for n in names)


def read_md5_file(path):
    """``{name: md5}`` from a file in ``md5sum`` format."""
    table = {}
    for n, line in enumerate(read_lines(path, "checksum table (see --results_dir)"), 1):
        m = re.match(r"^([0-9a-f]{32}) [ *](.+)$", line)
        if not m:
            raise UserError("%s line %d is not '<md5>  <name>': fix or regenerate the file" % (path, n))
        table[m.group(2)] = m.group(1)
    return table


def read_sizes_file(path):
    """``{name: bytes}`` from a ``<bytes>  <name>`` file."""
    table = {}
    for n, line in enumerate(read_lines(path, "size table (see --results_dir)"), 1):
        m = re.match(r"^(\d+)\s+(.+)$", line)
        if not m:
            raise UserError("%s line %d is not '<bytes>  <name>'" % (path, n))
        table[m.group(2)] = int(m.group(1))
    return table


def known_tables(results_dir=RESULTS_DIR):
    """``{set: {name: (bytes or None, md5 or None)}}`` from results/."""
    tables = {}
    for name, (md5_file, size_file, _) in SETS.items():
        md5s = read_md5_file(os.path.join(results_dir, md5_file)) if md5_file else {}
        sizes = read_sizes_file(os.path.join(results_dir, size_file)) if size_file else {}
        tables[name] = {n: (sizes.get(n), md5s.get(n)) for n in set(md5s) | set(sizes)}
    return tables


def is_tfrecord(path):
    """True when the file starts with a valid TFRecord header (length + its masked CRC)."""
    with open_input(path, "rb") as f:
        head = f.read(12)
    return len(head) == 12 and _U32.unpack_from(head, 8)[0] == masked_crc32c(head[:8])


def laid_out_as_tfrecords(path):
    """True when each record length of ``path``, read as a TFRecord's, leads exactly to the next
    and the last to the end of the file: a TFRecord file whatever its CRCs say (another kind of
    file does not chain so)."""
    size = os.path.getsize(path)
    pos = 0
    with open_input(path, "rb") as f:
        while pos < size:
            head = f.read(8)
            if len(head) < 8:
                return False
            pos += 16 + int.from_bytes(head, "little")
            f.seek(min(pos, size))
    return size > 0 and pos == size


def own_checksums(path):
    """``path`` checked against the checksums it carries: (True, what was checked), (False, what is
    damaged), or None when it carries none (not HDF5 or TFRecord, or an HDF5 file made before
    checksums were written)."""
    try:
        if hdf5.is_hdf5_file(path):
            with hdf5.open_file(path) as h:
                packed = "max_sequences_per_pack" in h.attrs  # pack's (the fix it names)
            if not hdf5.verify_checksums(path, packed):
                return None
            # every CRC whole, but a dataset or attribute the readers need may be gone (its name's
            # byte flipped): their own checks, else OK here and refused by the trainer
            if packed:
                packing.read_attrs(path)
            else:
                with hdf5.open_file(path) as h:
                    hdf5.check_unpacked(h, path)
            return True, "the CRC-32C of each of its datasets"
        if is_tfrecord(path):
            n = sum(1 for _ in read_records(path, verify=True))
            return True, "the CRCs of its %d records" % n
    except hdf5.NvidiaLayout:  # intact, carrying no checksums: as the reference's HDF5 is
        return None
    except UserError as e:
        return False, str(e)
    # damaged where the kind is told (its first header, its signature): not a file of no kind
    name, empty = os.path.basename(path), os.path.getsize(path) == 0
    if laid_out_as_tfrecords(path):
        return False, "laid out as TFRecords, but record 0's header fails its CRC: damaged, regenerate it"
    if not empty and (name.endswith(".tfrecord") or name in ("eval_10k", "eval_intermediate")):
        return False, "named as a TFRecord file, but record 0's header is not a TFRecord's: damaged, regenerate it"
    if name.endswith((".hdf5", ".h5")):  # (empty too: no HDF5 file is, where a TFRecord file of no record is)
        return False, "named as an HDF5 file, but it does not start with HDF5's signature: damaged, regenerate it"
    return None


TAG_WINDOWS = 8  # a TFRecord's content tag: this many 64-byte windows across the file, the last at its end
_SCANNED = {}  # path as given -> (bytes, digest of its record CRCs): what this process's start checks read
_TAGGED = {}  # path as given -> (bytes, content_tag): what this process's start read of its HDF5 files


def remember_record_crcs(shares):
    """Keep the record-CRC digests a start's scan took (each a share's {path: (bytes, digest)},
    by the path as given, the same string on every rank and node whatever its working directory:
    loader.check_records, every rank's gathered; none under --check_data=none), in place of an
    earlier start's in this process: a scan that reads every header anyway reads the CRCs beside
    them at no cost, where a digest of its own would read the file again. The content tags an earlier
    start read (``tagged``) go too: what a start reads is its own."""
    _SCANNED.clear()
    _TAGGED.clear()
    for seen in shares:
        _SCANNED.update(seen)


def scanned_crcs(path, size):
    """The digest of every record's CRC in order that this process's start scan took of ``path``
    (a TFRecord file of ``size`` bytes), or None (not scanned: --check_data=none, an HDF5 file)."""
    seen = _SCANNED.get(path)
    return seen[1] if seen and seen[0] == size else None


def remembered_content_tag(path, size):
    """``content_tag`` of ``path`` (``size`` bytes), kept as what this process's start read of it
    (``tagged``): an HDF5 file's datasets' CRC-32Cs are what tells its new times alone later, and
    the run's identity takes them from there."""
    _TAGGED[path] = (size, content_tag(path))
    return _TAGGED[path][1]


def tagged(path, size):
    """The ``content_tag`` this process's start read of ``path`` (``size`` bytes then), or None."""
    seen = _TAGGED.get(path)
    return seen[1] if seen and seen[0] == size else None


def content_tag(path):
    """A tag of a data file's content that costs a read of a few bytes, for a run's identity (its
    name and size alone let a file of the same size be swapped in): an HDF5 or packed file's
    dataset CRC-32Cs (what to-hdf5 and pack record); a TFRecord's first record's data CRC and a
    digest of TAG_WINDOWS windows of its bytes spread over the file (``record0:CRC;sampled:DIGEST``;
    checkpoint._same_file compares a tag of the first record alone, as earlier versions wrote it, by
    that part); an HDF5 file without CRC-32Cs: those windows (``sampled:DIGEST``); None for a file
    none of these can be read of (the identity keeps name and size). TFRecords swapped or edited
    outside the windows: ``scanned_crcs``."""
    import h5py
    try:
        if path.endswith((".hdf5", ".h5")):  # the loaders' rule (an HDF5 file may begin with a user block)
            with h5py.File(path, "r") as h:  # its attributes alone: the readers check its layout
                crcs = [[n, int(h[n].attrs[hdf5.CHECKSUM_ATTR])] for n in sorted(h)
                        if isinstance(h[n], h5py.Dataset) and hdf5.CHECKSUM_ATTR in h[n].attrs]
            if crcs:
                return "crc32c:" + hashlib.sha256(repr(crcs).encode()).hexdigest()[:16]
            # Without them (the reference's or NVIDIA's files, or ours of an older version), files of
            # one row count are of one size whatever they hold: a regenerated shard resumed a run
            # (a sweep). Its bytes sampled, as a TFRecord's.
            with open_input(path, "rb") as f:
                return "sampled:" + _sampled(f, os.fstat(f.fileno()).st_size)
        with open_input(path, "rb") as f:
            head, size = f.read(12), os.fstat(f.fileno()).st_size
            end = 12 + int.from_bytes(head[:8], "little")
            if len(head) < 12 or end + 4 > size:
                return None
            f.seek(end)
            tag = "record0:" + f.read(4).hex()
            # record 0 alone let a file of the same size and first record resume (another order of
            # its records: weights 0.012 apart); the last window holds the last record's CRC
            return "%s;sampled:%s" % (tag, _sampled(f, size))
    # what the readers refuse, in their words, before or after this (h5py's errors of damaged metadata too)
    except (OSError, ValueError, KeyError, RuntimeError, TypeError):
        return None


def _sampled(f, size):
    """A digest of TAG_WINDOWS 64-byte windows of open file ``f`` (``size`` bytes) spread over it,
    the last at its end."""
    digest = hashlib.sha256()
    for i in range(1, TAG_WINDOWS + 1):
        f.seek(max(0, size * i // TAG_WINDOWS - 64))
        digest.update(f.read(64))
    return digest.hexdigest()[:16]


def write_manifest(path, rows):
    """Write ``rows`` of (name, bytes, records, md5) atomically as a TSV manifest."""
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(MANIFEST_HEADER + "\n")
        for name, size, records, md5 in rows:
            f.write("%s\t%d\t%d\t%s\n" % (name, size, records, md5))


def read_manifest(path):
    """``{name: (bytes, md5)}`` from a manifest written by make-dataset."""
    lines = read_lines(path, "manifest")
    if not lines or lines[0] != MANIFEST_HEADER:
        raise UserError("%s is not a make-dataset manifest (first line must be %r): rerun make-dataset with "
                        "the same flags to write it again" % (path, MANIFEST_HEADER))
    table = {}
    for n, line in enumerate(lines[1:], 2):
        parts = line.split("\t")
        if len(parts) != 4 or not all(re.fullmatch(r"[0-9]+", n) for n in parts[1:3]) or not re.fullmatch(
                r"[0-9a-f]{32}", parts[3]):  # [0-9], not isdigit(): "5²" is a digit to it, not to int()
            raise UserError("%s line %d is not name<TAB>bytes<TAB>records<TAB>md5" % (path, n))
        if parts[0] in ("", ".", "..") or "/" in parts[0] or "\0" in parts[0]:  # it checks its own folder only
            raise UserError("%s line %d names %r, not a file of the manifest's folder: fix the line or regenerate "
                            "the manifest (make-dataset writes it)" % (path, n, parts[0]))
        if parts[0] in table:  # (the last line won: a bad md5 on the first passed unseen)
            raise UserError("%s line %d names %s again: a manifest lists each file once; remove the line or "
                            "regenerate the manifest (make-dataset writes it)" % (path, n, parts[0]))
        table[parts[0]] = (int(parts[1]), parts[3])
    return table


def _is_manifest(path):
    if not os.path.isfile(path):
        return False
    with open_input(path, "rb") as f:
        return f.read(len(MANIFEST_HEADER)) == MANIFEST_HEADER.encode()


class _Plan:
    """Files to check, each with its candidate expectations [(set, bytes, md5)], and the MISSING lines."""

    def __init__(self):
        self.files = {}      # path -> list of (set name, bytes or None, md5 or None)
        self.missing = []
        self.eval_pairs = []
        self.tfrecords = set()  # files that must be TFRecords (named so in a folder of TFRecords)
        self.unlisted = {}  # path -> how the manifest that does not list it is named (make-dataset's output)
        self.published = {}  # path -> results/'s expectations, checked beside its manifest's
        self.unfinished = []  # (folder, why) of a run that did not finish: make-dataset's, pack's
        self.leaving = {}  # path a manifest lists -> where it leads, outside the manifest's folder

    def listed(self, f, folder, expectations):
        """``f``, a file a manifest of ``folder`` lists, to be checked against ``expectations``, unless
        a symbolic link (it, or a folder on its way) leads out of ``folder``: a manifest's name never
        reaches outside its folder (read, it was any file: /etc/passwd)."""
        real = os.path.realpath(f)
        if os.path.commonpath([real, os.path.realpath(folder)]) != os.path.realpath(folder):
            self.leaving[f] = real
            return False
        self.files[f] = expectations
        return True


def expectations(path, tables, name=None):
    """[(set, bytes, md5)] that ``tables`` list for ``path``'s name (or ``name``); a part- shard
    is held against the set of its kind (TFRecord or text: the two share names), read from ``path``."""
    name = name or os.path.basename(path)
    kinds = [s for s, t in tables.items() if name in t]
    if name.startswith("part-") and kinds:
        kinds = ["tfrecord" if is_tfrecord(path) else "text"]
    return [(s,) + tables[s][name] for s in kinds if name in tables[s]]


def _dir_sets(directory, names, tables):
    """The reference sets a directory holds, recognised from the files present."""
    found = set()
    parts = sorted(n for n in names if n in PART_NAMES)
    if "eval.txt" in names or "eval.md5" in names or (parts and not is_tfrecord(os.path.join(directory, parts[0]))):
        found.add("text")
    if "eval_10k" in names or "eval_intermediate" in names or (
            parts and is_tfrecord(os.path.join(directory, parts[0]))):
        found.add("tfrecord")
    # the reference's checkpoint folders (tf1_ckpt/, tf2_ckpt/), by name too: one whose download
    # failed, left with vocab.txt and bert_config.json alone, is its set with files MISSING (it passed)
    folder = os.path.basename(os.path.normpath(directory))
    if "model.ckpt-28252.meta" in names or folder == "tf1_ckpt":
        found.add("checkpoint_tf1")
    elif folder == "tf2_ckpt":
        found.add("checkpoint_tf2")
    elif "model.ckpt-28252.index" in names:
        size = os.path.getsize(os.path.join(directory, "model.ckpt-28252.index"))
        found.add("checkpoint_tf2" if size == tables["checkpoint_tf2"]["model.ckpt-28252.index"][0]
                  else "checkpoint_tf1")
    return found


def _refuse_special(path):
    """A named pipe (or a device) to check: opened to be read, a FIFO no process writes to waits for
    ever (verify hung). A folder's files are its regular files alone."""
    refuse_special_file(path, "", "give files or directories to verify")


def plan(paths, tables, manifest=None):
    from mlperf_bert.dataset import text_pipeline  # (here: its sentence splitter's import is verify's alone, not the trainer's)
    p = _Plan()
    for path in paths:
        if not os.path.exists(path):
            raise UserError("%s does not exist: give existing files or directories" % path)
        _refuse_special(path)
        if manifest is None and _is_manifest(path):
            table = read_manifest(path)
            d = os.path.dirname(os.path.abspath(path))
            for name, (size, md5) in sorted(table.items()):
                f = os.path.join(d, name)
                if os.path.exists(f):
                    _refuse_special(f)
                    if p.listed(f, d, [(path, size, md5)]):
                        p.published[f] = expectations(f, tables)
                else:
                    p.missing.append(f)
            # as for its folder (`verify DIR`): a file there named as make-dataset's output that the
            # manifest does not list is more than its set, and a trainer given part-* reads it
            for name in sorted(os.listdir(d)):
                f = os.path.join(d, name)
                if name not in table and OUTPUT_NAME.match(name) and os.path.isfile(f):
                    p.files[f] = expectations(f, tables)
                    p.unlisted[f] = os.path.basename(path)
            continue
        if os.path.isdir(path):
            names = sorted(n for n in os.listdir(path) if os.path.isfile(os.path.join(path, n))
                           and not is_lock_file(n)  # a run's lock, or one a killed run left
                           # pack's and text-pipeline's records: checked as the run each records (below)
                           and n not in (packing.RECORD_NAME, text_pipeline.RECORD_NAME))
            own = os.path.join(path, MANIFEST_NAME)
            if manifest is None and MANIFEST_NAME in names:
                # make-dataset's folder: its manifest says what it holds (the reference publishes
                # sizes only for the full set); files it does not list are checked as any other,
                # but one named as its output is not its (a trainer given part-* reads it too).
                # One damaged (emptied, overwritten) is refused: the folder was checked by nothing.
                table = read_manifest(own)
                for name in names:
                    if name not in (MANIFEST_NAME, SETTINGS_NAME):  # (make-dataset's own records: not outputs)
                        f = os.path.join(path, name)
                        if name not in table:
                            p.files[f] = expectations(f, tables)
                        elif p.listed(f, path, [(own,) + table[name]]):
                            # its own manifest proves it intact, not that it is the reference's
                            p.published[f] = expectations(f, tables)
                        if name not in table and OUTPUT_NAME.match(name):
                            p.unlisted[f] = MANIFEST_NAME
                p.missing += [os.path.join(path, n) for n in sorted(table) if n not in names]
                continue
            if manifest is None and SETTINGS_NAME in names:
                # make-dataset's folder that its run has not finished (killed, or still running): what
                # it holds passed its CRCs one by one, a folder with no output at all passed
                p.unfinished.append((path, run_record.unfinished_make_dataset(path)))
            if manifest is not None:
                for name in names:
                    if name not in (MANIFEST_NAME, SETTINGS_NAME):  # (make-dataset's own records: not outputs)
                        exp = manifest.get(name)  # (a name of this folder's listing, not the manifest's text:
                        # a link into a shared store is the folder's file, as a trainer reads it)
                        p.files[os.path.join(path, name)] = [("--manifest",) + exp] if exp else []
                        if not exp and OUTPUT_NAME.match(name):  # as in make-dataset's folder: more than the set
                            p.unlisted[os.path.join(path, name)] = "--manifest"
                p.missing += [os.path.join(path, n) for n in sorted(manifest) if n not in names]
                continue
            sets = _dir_sets(path, names, tables)
            # shards of another count than the reference's (a sample's part-*-of-00004): a folder of
            # TFRecords too when its first is one, as _dir_sets tells the reference's
            others = [n for n in names if n.startswith("part-") and OUTPUT_NAME.match(n) and n not in PART_NAMES]
            other_tfrecords = bool(others) and "text" not in sets and is_tfrecord(os.path.join(path, others[0]))
            for name in names:
                if name == SETTINGS_NAME:  # an unfinished make-dataset's record: its folder's line says that run
                    continue
                f = os.path.join(path, name)
                exps = expectations(f, tables)
                if sets & {"tfrecord", "text"} == {"tfrecord"} and name in SETS["tfrecord"][2]:
                    # a folder of TFRecords: a shard of another kind (a text shard, an error page, an
                    # empty file, an HDF5 file) is not one of the set, whatever another table says of its name
                    exps = [("tfrecord",) + tables["tfrecord"][name]] if name in tables["tfrecord"] else []
                    p.tfrecords.add(f)
                elif other_tfrecords and name in others:
                    p.tfrecords.add(f)
                if name.startswith("model.ckpt-28252.") and sets & {"checkpoint_tf1", "checkpoint_tf2"}:
                    exps = [e for e in exps if e[0] in sets]
                p.files[f] = exps
            # text-pipeline's folder: its record lists the set its run made (a sample's text gives fewer than
            # 500 shards, all named -of-00500): the others were 499 MISSING lines; one it lists that is gone is
            # MISSING, and its run unfinished (below)
            made = text_pipeline.unfinished_run(path)[0] if os.path.isfile(os.path.join(path, text_pipeline.RECORD_NAME)) \
                else None
            for s in sorted(sets):
                p.missing += [os.path.join(path, n) for n in SETS[s][2]
                              if n not in names and not (s == "text" and made and n not in made)]
            if "eval.txt" in names and "eval.md5" in names:
                p.eval_pairs.append((os.path.join(path, "eval.txt"), os.path.join(path, "eval.md5")))
        else:
            if manifest is not None:
                exp = manifest.get(os.path.basename(path))
                p.files[path] = [("--manifest",) + exp] if exp else []
                if not exp and OUTPUT_NAME.match(os.path.basename(path)):  # as in a folder given with it
                    p.unlisted[path] = "--manifest"
            else:
                p.files[path] = expectations(path, tables)
    # the folder of packed files (given, or their folder given) whose pack run did not finish: each
    # file is complete and passes, but not all of the run's are there (a trainer took them for the set)
    folders = {os.path.normpath(os.path.dirname(f) or ".") for f in p.files if f.endswith(packing.OUTPUT_SUFFIX)}
    folders |= {os.path.normpath(d) for d in paths if os.path.isfile(os.path.join(d, packing.RECORD_NAME))}
    for folder in sorted(folders):
        why = packing.unfinished_run(folder)
        if why:
            p.unfinished.append((folder, "holds " + why))
    # the same of text-pipeline's shards (make-dataset refuses them): only a folder it wrote has its record
    folders = {os.path.normpath(os.path.dirname(f) or ".") for f in p.files} | {os.path.normpath(d) for d in paths}
    for folder in sorted(folders):
        if os.path.isfile(os.path.join(folder, text_pipeline.RECORD_NAME)):
            why = text_pipeline.unfinished_run(folder)[1]
            if why:
                p.unfinished.append((folder, "holds " + why))
    names = {os.path.basename(f): f for f in p.files}
    if "eval.txt" in names and "eval.md5" in names:
        pair = (names["eval.txt"], names["eval.md5"])
        if pair not in p.eval_pairs:
            p.eval_pairs.append(pair)
    return p


def by_content(tables):
    """{(bytes, md5): (set, name)} of every published file with both: a file is found by its
    content whatever its name (configs/bert_config_large.json is the reference's bert_config.json)."""
    return {(size, md5): (set_, name) for set_, t in sorted(tables.items())
            for name, (size, md5) in sorted(t.items()) if size is not None and md5}


def _source(label):
    """How an expectation's source is named: results/'s set, or the manifest."""
    return "results/ (%s)" % label if label in SETS else label


def mismatch(size, md5, exps):
    """Why a file of ``size`` bytes and ``md5`` (None: not hashed, its size already differs)
    matches none of ``exps``: one clause an expectation, joined by "; or "."""
    why = []
    for label, want_size, want_md5 in exps:
        if want_size is not None and want_size != size:
            why.append("%d bytes where %s lists %d" % (size, _source(label), want_size))
        else:
            why.append("md5 %s where %s lists %s" % (md5, _source(label), want_md5))
    return "; or ".join(why)


def verify(paths, results_dir=RESULTS_DIR, manifest=None, workers=None, out=print):
    """Check ``paths``; print one line per file and a summary line; return True when everything
    present and expected is OK."""
    tables = known_tables(results_dir)
    p = plan(paths, tables, manifest)
    if not p.files and not p.missing and not p.unfinished and not p.leaving:
        raise UserError("nothing to verify in %s: give the files or a directory holding them"
                        % ", ".join(paths))
    known = by_content(tables)
    known_sizes = {size for size, _ in known}
    # Hash only where a known md5 could still decide: a size mismatch alone fails a file; a file no
    # name matches is hashed when its size is a published file's (it may be that file renamed).
    to_hash = [f for f, exps in p.files.items()
               if any(e[2] and e[1] in (None, os.path.getsize(f)) for e in exps)
               or not exps and os.path.getsize(f) in known_sizes]
    md5s = md5_many(to_hash, workers) if to_hash else {}
    ok = True
    counts = dict.fromkeys(("OK", "MISMATCH", "MISSING", "UNKNOWN"), 0)

    def say(verdict, line):
        counts[verdict] += 1
        out("%s %s" % (verdict, escaped(line)))
    for f, exps in sorted(p.files.items()):
        size = os.path.getsize(f)
        tmp = unfinished_write(f)
        if tmp:  # its records, cut off where a kill fell, pass their CRCs: it was "OK"
            ok = False
            say("MISMATCH", "%s (the temporary of an unfinished write of %s, process %s: still running, or killed; "
                            "not a finished file: let it end, or rerun the command that makes %s)"
                % (f, tmp[0], tmp[1], tmp[0]))
            continue
        download = unfinished_download(f)
        if download:  # a partial TFRecord cut at a record's end passes its CRCs ("OK"), a text one is "UNKNOWN"
            ok = False
            say("MISMATCH", "%s (the file of an unfinished download of %s: cut off, killed or still running; not a "
                            "finished file: run the same download again to finish it)" % (f, download))
            continue
        if f in p.unlisted:
            ok = False
            say("MISMATCH", "%s (named as a make-dataset output, but %s does not list it: %s)" % (
                f, p.unlisted[f], "the folder holds more than that manifest's set, and a trainer given part-* reads it "
                "too; remove it" if p.unlisted[f] == "--manifest" else "the folder holds more than make-dataset made; "
                "remove it, or rerun make-dataset to list it"))
            continue
        if not exps:
            same = None if f in p.tfrecords else known.get((size, md5s.get(f)))  # no TFRecord's md5 is published
            own = None if same else own_checksums(f)
            if same and os.path.basename(f) in SET_NAMES:
                # a set's own name holding another of its files (a shard copied over a missing one)
                ok = False
                say("MISMATCH", "%s: its content is the published %s of %s, not %s: replace it with the right file"
                    % (f, same[1], _source(same[0]), os.path.basename(f)))
            elif same:
                say("OK", "%s (by content: the published %s of %s, md5+size)" % (f, same[1], _source(same[0])))
            elif f in p.tfrecords and (own is None or own[0] and not is_tfrecord(f)):
                ok = False
                say("MISMATCH", "%s (in a folder of TFRecords, but not a TFRecord file%s)" % (
                    f, ": empty" if not size else ": an HDF5 file" if hdf5.is_hdf5_file(f) else ""))
            elif own is None:
                say("UNKNOWN", "%s (no published checksum%s; not checked)" % (
                    f, ", and it carries none of its own" if hdf5.is_hdf5_file(f) else ""))
            elif own[0]:
                say("OK", "%s (no published checksum; its own: %s)" % (f, own[1]))
            else:
                ok = False
                say("MISMATCH", "%s (no published checksum; its own: %s)" % (f, own[1]))
            continue
        def holds(e):  # an expectation (source, bytes or None, md5 or None) this file meets
            return (e[1] is None or e[1] == size) and (e[2] is None or e[2] == md5s.get(f))
        good = [e for e in exps if holds(e)]
        published = p.published.get(f)
        if good and published and not any(holds(e) for e in published):
            ok = False
            say("MISMATCH", "%s: intact as %s lists it, but %s: not the reference's file (made from other text, "
                            "vocab or flags); `verify --manifest=%s %s` checks the folder against its manifest "
                            "alone" % (f, os.path.basename(good[0][0]), mismatch(size, md5s.get(f), published),
                                       # (quoted: a command to paste, "My Data/manifest.tsv" one word)
                                       shlex.quote(good[0][0]), shlex.quote(os.path.dirname(good[0][0]) or ".")))
            continue
        if good and not good[0][2] and good[0][0] == "tfrecord":
            # a size alone passes a file of zeros (a preallocated download cut off): its records too
            own = own_checksums(f) or (False, "not a TFRecord file")
            if own[0]:
                say("OK", "%s (%s, size; its own: %s)" % (f, _source(good[0][0]), own[1]))
            else:
                ok = False
                say("MISMATCH", "%s (%s: the size is the published one, but %s)" % (f, _source(good[0][0]), own[1]))
        elif good:
            what = "md5+size" if good[0][2] else "size only"
            say("OK", "%s (%s, %s)" % (f, _source(good[0][0]), what))
        else:
            ok = False
            say("MISMATCH", "%s: %s" % (f, mismatch(size, md5s.get(f), exps)))
    for f, real in sorted(p.leaving.items()):
        ok = False
        say("MISMATCH", "%s (a symbolic link to %s, outside the folder its manifest lists: the folder does not hold "
                        "that file, and it was not read; put the file itself there, or verify the folder it is in)"
            % (f, real))
    for d, why in p.unfinished:
        ok = False
        say("MISMATCH", "%s (%s)" % (d, why))
    for f in p.missing:
        ok = False
        say("MISSING", f)
    for txt, md5 in p.eval_pairs:
        good, line = check_eval_articles(txt, md5)
        ok = ok and good
        counts["OK" if good else "MISMATCH"] += 1
        out(escaped(line))
    out("verify: %s: %s" % (", ".join("%d %s" % (n, k) for k, n in counts.items()),
                            "every file checked matches" if ok else "FAILED"))
    return ok


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_string("manifest", None, "check the given paths against this make-dataset manifest "
                        "instead of results/", flag_values=fv)
    flags.DEFINE_string("results_dir", RESULTS_DIR, "directory of the known md5/size tables", flag_values=fv)
    flags.DEFINE_workers("hashing threads (default: all cores)", flag_values=fv)
    paths = flags.parse(fv, argv, positional="FILE|DIR|MANIFEST ...")
    # "--manifest=$OTHER_SITE" with the variable unset was no --manifest: the folder passed against
    # its own manifest, as if the two sites agreed
    flags.refuse_given_empty(fv, {"manifest": "the make-dataset manifest to check against",
                                  "results_dir": "the directory of the md5 and size tables"})
    if not paths:
        raise UserError("give at least one file, directory or manifest.tsv to verify")
    if fv.manifest:
        refuse_special_file(fv.manifest, "--manifest", "give the manifest.tsv that make-dataset wrote")
    manifest = read_manifest(fv.manifest) if fv.manifest else None
    ok = verify(paths, fv.results_dir, manifest, fv.workers)
    return 0 if ok else 1

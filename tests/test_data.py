"""The trainer's input pipeline on the golden seq-128 file: order, sharding, resume, workers."""
import multiprocessing
import os
import shutil
import types

import pytest
import torch

from mlperf_bert.trainer import evaluation, loader
from mlperf_bert.dataset import tfrecord
from mlperf_bert.errors import UserError
from mlperf_bert.dataset.example import decode_pretraining_example

SEQ, PRED = 128, 20


@pytest.fixture(scope="module")
def shards(golden_dir, tmp_path_factory):
    """Three small shards cut from the golden file (40, 24 and 33 records) and their records."""
    recs = []
    for i, r in enumerate(tfrecord.read_records(os.path.join(golden_dir, "part-00000.s128.tfrecord"))):
        if i >= 97:
            break
        recs.append(r)
    d = tmp_path_factory.mktemp("shards")
    paths, start = [], 0
    for n in (40, 24, 33):
        p = str(d / ("part-%d.tfrecord" % len(paths)))
        tfrecord.write_records(p, recs[start:start + n])
        paths.append(p)
        start += n
    return paths, recs


def ids_of(batches):
    return [tuple(row) for b in batches for row in b["input_ids"].numpy()]


def expected_ids(recs):
    return [tuple(decode_pretraining_example(r, SEQ, PRED)["input_ids"]) for r in recs]


def test_noshuffle_is_file_order_and_decodes_every_feature(shards):
    paths, recs = shards
    batches = list(loader.PretrainingBatches(paths, SEQ, PRED, 8, shuffle=False, repeat=False))
    assert ids_of(batches) == expected_ids(recs)
    assert [b["input_ids"].shape[0] for b in batches] == [8] * 12 + [1]
    first = decode_pretraining_example(recs[0], SEQ, PRED)
    b = batches[0]
    for name in ("input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids"):
        assert b[name][0].tolist() == first[name].tolist()
    assert b["masked_lm_weights"].dtype.is_floating_point
    assert b["masked_lm_weights"][0].tolist() == first["masked_lm_weights"].tolist()
    assert b["next_sentence_labels"][0].item() == int(first["next_sentence_labels"][0])


def test_ranks_take_contiguous_slices_of_each_global_batch(shards):
    paths, recs = shards
    full = ids_of(loader.PretrainingBatches(paths, SEQ, PRED, 8, shuffle=False, max_batches=5))
    parts = [list(loader.PretrainingBatches(paths, SEQ, PRED, 8, rank=r, world_size=2, shuffle=False,
                                          max_batches=5)) for r in range(2)]
    assert all(b["input_ids"].shape[0] == 4 for p in parts for b in p)
    merged = [row for b0, b1 in zip(*parts) for row in ids_of([b0]) + ids_of([b1])]
    assert merged == full == expected_ids(recs)[:40]


def test_shuffle_is_a_seeded_permutation_per_epoch(shards):
    paths, recs = shards
    n = len(recs)

    def epoch(seed, e=0):
        ds = loader.PretrainingBatches(paths, SEQ, PRED, 1, shuffle=True, seed=seed, buffer_size=16,
                                     max_batches=n * (e + 1))
        return ids_of(ds)[n * e:]

    a, again, other, second = epoch(1), epoch(1), epoch(2), epoch(1, e=1)
    assert a == again
    assert sorted(a) == sorted(expected_ids(recs)) == sorted(second)
    assert a != expected_ids(recs) and a != other and a != second


def test_resume_position_and_workers_give_the_same_stream(shards):
    paths, _ = shards
    kw = dict(shuffle=True, seed=5, buffer_size=10)
    full = list(loader.PretrainingBatches(paths, SEQ, PRED, 6, max_batches=30, **kw))
    tail = list(loader.PretrainingBatches(paths, SEQ, PRED, 6, start_batch=17, max_batches=30, **kw))
    assert ids_of(tail) == ids_of(full[17:])
    workers = loader.make_loader(loader.PretrainingBatches(paths, SEQ, PRED, 6, start_batch=17,
                                                           max_batches=30, **kw), num_workers=2)
    assert ids_of(workers) == ids_of(full[17:])


def test_only_a_cuda_run_pins_its_batches(shards, monkeypatch):
    """A run on the CPU of a GPU machine (--device=cpu) pinned its batches: torch's pin thread made a
    CUDA context on the current GPU (GPU 0, every rank) and copied each batch for nothing. The run's
    device decides, not whether the machine has CUDA (faked here)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ds = loader.PretrainingBatches(shards[0], SEQ, PRED, 6, max_batches=1)
    assert loader.make_loader(ds, 0).loader.pin_memory is False
    assert loader.make_loader(ds, 0, pin=True).loader.pin_memory is True
    for kind in ("cpu", "cuda"):  # --do_eval's reference batches
        data = types.SimpleNamespace(max_seq_length=SEQ, max_predictions_per_seq=PRED, num_workers=0)
        ev = types.SimpleNamespace(eval_batch_size=6, max_eval_steps=1)
        batches = evaluation.reference_eval_batches(data, ev, shards[0], 0, 1, None, torch.device(kind))
        assert batches.loader.pin_memory is (kind == "cuda")


def test_bad_inputs_are_one_line_errors(shards, tmp_path):
    paths, recs = shards
    with pytest.raises(UserError, match="expected 512"):
        loader.check_seq_length(paths, 512, 76)
    bad = tmp_path / "bad.tfrecord"
    raw = bytearray(open(paths[1], "rb").read())
    raw[len(raw) // 2] ^= 0xFF
    bad.write_bytes(bytes(raw))
    with pytest.raises(UserError, match="bad.tfrecord: record .* corrupt"):
        list(loader.PretrainingBatches([str(bad)], SEQ, PRED, 8, shuffle=False, repeat=False))
    # from a worker process: the same single line, and the worker is ended with it (not 5 s later,
    # when the cycle collector frees the traceback's frames)
    before = set(multiprocessing.active_children())
    with pytest.raises(UserError, match="^[^\n]*bad.tfrecord: record [0-9]+ [^\\n]*corrupt[^\n]*$"):
        list(loader.make_loader(loader.PretrainingBatches([str(bad)], SEQ, PRED, 8, shuffle=False,
                                                      repeat=False), num_workers=1))
    assert not set(multiprocessing.active_children()) - before
    with pytest.raises(UserError, match="does not exist"):
        loader.input_files(str(tmp_path / "missing-*"))
    empty = tmp_path / "empty.tfrecord"
    empty.write_bytes(b"")
    with pytest.raises(UserError, match="empty.tfrecord holds no records"):
        next(iter(loader.PretrainingBatches([str(empty)], SEQ, PRED, 8)))


def test_an_empty_file_among_others_is_refused_naming_it(shards, tmp_path):
    """A hostile review: an empty file among several --input_file or --eval_input_file files was
    skipped silently (only an epoch of no record was an error); to-hdf5 and pack refuse it."""
    paths, _ = shards
    empty = str(tmp_path / "empty.tfrecord")
    open(empty, "wb").close()
    files = [paths[0], empty, paths[1]]
    for read in (lambda: loader.check_seq_length(files, SEQ, PRED), lambda: loader.check_records(files),
                 lambda: loader.count_records(files),
                 lambda: list(loader.PretrainingBatches(files, SEQ, PRED, 8, shuffle=False, repeat=False))):
        with pytest.raises(UserError) as e:
            read()
        assert str(e.value) == "%s holds no records: check the paths, or make it again" % empty


def test_an_input_of_more_files_than_the_process_may_open_is_read_in_order(tiny_record, tmp_path, few_open_files):
    """A hostile sweep: the reader kept every input file open, so an input of more files than the
    open-file limit (RLIMIT_NOFILE; 1024 on many hosts) ended the run mid-way: a traceback, 'OSError:
    [Errno 24] Too many open files' (an HDF5 file's: '... is not an HDF5 file'). It keeps a quarter of
    the limit open, the least recently read closed first."""
    with few_open_files() as room:
        paths = [str(tmp_path / ("part-%03d.tfrecord" % i)) for i in range(room + 8)]
        for i, p in enumerate(paths):
            tfrecord.write_records(p, [tiny_record(input_ids=[2, 5 + i, 6, 3, 0, 0, 0, 0])])
        batches = list(loader.PretrainingBatches(paths, 8, 2, 8, shuffle=False, repeat=False))
    assert [row[1] for b in batches for row in b["input_ids"].tolist()] == [5 + i for i in range(len(paths))]


@pytest.mark.parametrize("suffix", [".tfrecord", ".hdf5"])
def test_an_input_file_replaced_while_the_run_reads_it_is_refused_naming_it(shards, tmp_path, suffix):
    """A hostile sweep (two commands at once): the trainer opens each input file as the stream reaches
    it, so one that make-dataset, to-hdf5 or pack rewrote into the run's --input_file meanwhile (renamed
    over it) was read as it is now: its new records silently trained on, or, the old one still open,
    "record 13 is corrupt (data CRC mismatch): the file is damaged" (it is not). Now one line naming it."""
    from mlperf_bert.dataset import hdf5
    paths, _ = shards
    a, b = str(tmp_path / ("a" + suffix)), str(tmp_path / ("b" + suffix))
    for path, src in ((a, paths[:1]), (b, paths[1:2])):
        if suffix == ".hdf5":
            hdf5.tfrecords_to_hdf5(src, path, SEQ, PRED, progress=False)
        else:
            tfrecord.write_records(path, list(tfrecord.read_records(src[0])))
    it = iter(loader.PretrainingBatches([a, b], SEQ, PRED, 8, shuffle=False, repeat=False))
    next(it)  # a is being read; b is not opened yet
    new = str(tmp_path / ("new" + suffix))  # another command's output, renamed over b
    if suffix == ".hdf5":
        hdf5.tfrecords_to_hdf5(paths[2:], new, SEQ, PRED, progress=False)
    else:
        tfrecord.write_records(new, list(tfrecord.read_records(paths[2])))
    os.replace(new, b)
    with pytest.raises(UserError) as e:
        list(it)
    assert str(e.value) == (
        "%s was replaced or rewritten while this run read it (by another command, since the run started): a run "
        "trains on the data it started with; put that file back, or write new data elsewhere and start a new run in "
        "another --output_dir" % b)


def test_an_input_file_with_only_new_times_is_read_on(shards, tmp_path, monkeypatch):
    """A hostile review: the same bytes under a new mtime (the data folder synced again by rsync without
    -t, which renames a new copy over each file; a touch) stopped a good run as "replaced or rewritten".
    Records with the CRCs the start's scan saw are the run's data: read on; other records of the same
    size are still refused."""
    from mlperf_bert.dataset import checksums
    paths, _ = shards
    a, b = str(tmp_path / "a.tfrecord"), str(tmp_path / "b.tfrecord")
    for path, src in ((a, paths[0]), (b, paths[1])):
        tfrecord.write_records(path, list(tfrecord.read_records(src)))
    monkeypatch.setattr(checksums, "_SCANNED", {})
    checksums.remember_record_crcs([loader.check_records([a, b])])
    want = list(loader.PretrainingBatches([a, b], SEQ, PRED, 8, shuffle=False, repeat=False))
    it = iter(loader.PretrainingBatches([a, b], SEQ, PRED, 8, shuffle=False, repeat=False))
    got = [next(it)]
    shutil.copyfile(b, b + ".new")  # the same bytes, a new mtime, renamed over it
    os.utime(b + ".new", ns=(10 ** 18, 10 ** 18))
    os.replace(b + ".new", b)
    got += list(it)
    assert len(got) == len(want) and all(torch.equal(x[k], y[k]) for x, y in zip(got, want) for k in x)
    records = list(tfrecord.read_records(b))  # other records, the same size: refused
    it = iter(loader.PretrainingBatches([a, b], SEQ, PRED, 8, shuffle=False, repeat=False))
    next(it)
    tfrecord.write_records(b, records[1:] + records[:1])
    with pytest.raises(UserError, match="was replaced or rewritten while this run read it"):
        list(it)


def test_an_hdf5_file_named_as_tfrecords_is_named_as_such(shards, tmp_path):
    """A hostile review: an HDF5 file named *.tfrecord was 'record 0 has a corrupt length (CRC mismatch):
    the file is damaged': the trainer tells HDF5 files by their name."""
    from mlperf_bert.dataset import hdf5
    paths, _ = shards
    named = str(tmp_path / "part.tfrecord")
    hdf5.tfrecords_to_hdf5(paths[:1], named, SEQ, PRED, progress=False)
    for read in (lambda: loader.check_seq_length([named], SEQ, PRED), lambda: loader.check_records([named]),
                 lambda: list(loader.PretrainingBatches([named], SEQ, PRED, 8, repeat=False))):
        with pytest.raises(UserError) as e:
            read()
        assert str(e.value) == ("%s is an HDF5 file (it starts with HDF5's signature), but the trainer reads files not "
                                "named *.hdf5 or *.h5 as TFRecords: rename it *.hdf5" % named)


def test_a_bad_record_is_refused_naming_its_file_and_its_index_there(tiny_record, tmp_path):
    """A hostile review: input_ids 2**32 + 5 trained as token 5, and an int64 masked_lm_weights was
    'record 1: ...' (its index in the batch, no file): one line naming the file and its record."""
    good, bad = str(tmp_path / "good"), str(tmp_path / "bad")
    tfrecord.write_records(good, [tiny_record()] * 3)
    for record, why in ((tiny_record(input_ids=[2**32 + 5] + [5] * 7), "input_ids holds 4294967301, outside int32"),
                        (tiny_record(masked_lm_weights=("int64", [1, 1])),
                         "masked_lm_weights holds int64 values, not float")):
        tfrecord.write_records(bad, [tiny_record()] * 5 + [record, tiny_record()])
        with pytest.raises(UserError) as e:
            list(loader.PretrainingBatches([good, bad], 8, 2, 4, shuffle=False, repeat=False))
        assert str(e.value).startswith("%s: record 5: feature %s: " % (bad, why)), str(e.value)


@pytest.mark.parametrize("weight", [2.0, -1.0, 0.5])
def test_a_masked_lm_weight_other_than_0_or_1_is_refused(tiny_record, tmp_path, weight):
    """A hostile review: only a weight that was not finite was refused, though the message said '(0 or
    1)': a weight of 2 or -1 trained, and counted in the eval accuracy."""
    path = str(tmp_path / "w.tfrecord")
    tfrecord.write_records(path, [tiny_record()] * 2 + [tiny_record(masked_lm_weights=[1.0, weight])])
    with pytest.raises(UserError) as e:
        list(loader.PretrainingBatches([path], 8, 2, 4, shuffle=False, repeat=False))
    assert str(e.value) == ("%s: record 2 has masked_lm_weights %s, where BERT pre-training data holds 0 or 1: the "
                            "file is damaged, or not made by create_pretraining_data: make it again" % (path, weight))


def test_a_token_id_past_the_vocab_names_the_record_and_its_own_id(tiny_record, tmp_path):
    """A hostile review: the error paired the batch's first bad record with the batch's largest id."""
    a, b = str(tmp_path / "a.tfrecord"), str(tmp_path / "b.tfrecord")
    tfrecord.write_records(a, [tiny_record()] * 2 + [tiny_record(input_ids=[2, 5, 40000, 3, 0, 0, 0, 0])])
    tfrecord.write_records(b, [tiny_record(masked_lm_ids=[50000, 8])] + [tiny_record()] * 2)
    with pytest.raises(UserError) as e:
        list(loader.PretrainingBatches([a, b], 8, 2, 6, shuffle=False, repeat=False, vocab_size=30522))
    assert str(e.value).startswith("%s: record 2 has token id 40000 but the model's vocab_size is 30522: " % a)


def test_hdf5_input_reads_the_same_examples(shards, tmp_path):
    from mlperf_bert.dataset import hdf5
    paths, recs = shards
    p = str(tmp_path / "part-0.hdf5")
    assert hdf5.tfrecords_to_hdf5(paths[:1], p, SEQ, PRED, progress=False) == 40
    a = list(loader.PretrainingBatches([p], SEQ, PRED, 8, shuffle=True, seed=3, max_batches=5))
    b = list(loader.PretrainingBatches(paths[:1], SEQ, PRED, 8, shuffle=True, seed=3, max_batches=5))
    for x, y in zip(a, b):
        for k in x:
            assert x[k].tolist() == y[k].tolist(), k


def test_batch_decoding_equals_record_by_record_python_decoding(shards, monkeypatch):
    """The loader decodes a batch in one call (the C decoder where built): every feature, value and
    dtype equal to decoding each record alone in pure Python, as the loader did before."""
    import functools

    import numpy as np
    from mlperf_bert.dataset import example
    paths, recs = shards
    fast = list(loader.PretrainingBatches(paths, SEQ, PRED, 8, shuffle=True, seed=3, repeat=False))
    monkeypatch.setattr(loader, "decode_pretraining_batch", functools.partial(example.decode_pretraining_batch,
                                                                              fast=False))
    slow = list(loader.PretrainingBatches(paths, SEQ, PRED, 8, shuffle=True, seed=3, repeat=False))
    assert len(fast) == len(slow) == 13
    for a, b in zip(fast, slow):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    # and both equal the per-record decoder, record by record
    by_id = {tuple(decode_pretraining_example(r, SEQ, PRED)["input_ids"]): decode_pretraining_example(r, SEQ, PRED)
             for r in recs}
    for b in fast:
        for i in range(b["input_ids"].shape[0]):
            want = by_id[tuple(b["input_ids"][i].tolist())]
            for k in ("input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
                assert np.array_equal(b[k][i].numpy(), want[k]), k
            assert b["next_sentence_labels"][i].item() == int(want["next_sentence_labels"][0])


def test_a_killed_writes_temporary_or_a_named_pipe_the_glob_matches_is_refused(shards, tmp_path):
    """A hostile sweep: --input_file='tfrecords/part-*' took a killed make-dataset's
    part-00001-of-00002.tmp-4242 as a shard (its records, cut at a record's end, pass their CRCs: it
    was trained on), and a named pipe no process writes to made the run wait for ever as it opened it.
    The trainer's reading of --input_file and --eval_input_file refuses both, naming the file."""
    paths, recs = shards
    d = tmp_path / "tfrecords"
    d.mkdir()
    tfrecord.write_records(str(d / "part-00000-of-00002"), recs[:20])
    tmp = d / "part-00001-of-00002.tmp-4242"
    tfrecord.write_records(str(tmp), recs[20:27])
    for flag in ("--input_file", "--eval_input_file"):
        with pytest.raises(UserError) as e:
            loader.input_files(str(d / "part-*"), flag)
        assert str(e.value) == (
            "%s %s is the temporary of an unfinished write of part-00001-of-00002 (process 4242: still running, or "
            "killed): let it end, or rerun the command that makes part-00001-of-00002 (make-dataset goes on where it "
            "stopped); or narrow the glob" % (flag, tmp))
    os.remove(tmp)
    os.mkfifo(str(d / "part-00001-of-00002"))
    with pytest.raises(UserError) as e:
        loader.input_files(str(d / "part-*"))
    assert str(e.value) == ("--input_file %s is a named pipe (FIFO), not a regular file: give the path of a regular "
                            "file" % (d / "part-00001-of-00002"))


def test_loader_bench_times_the_pure_python_record_by_record_reader(shards, monkeypatch):
    """A sweep of the benches: bench/loader_throughput.py's "record by record pure-Python decoding
    (the loader before)" read each record with ``_read_one``, which since 2026-12-04 runs the C batch
    decoder on one record: it timed C against C (4.7x printed, docs/training.md's 12.0x against the
    pure-Python loader). Its reader decodes with the pure-Python ``decode_example``, no batch decoder,
    to the same values."""
    import sys
    from mlperf_bert.dataset import example
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    import loader_throughput
    paths, _ = shards
    want = list(loader.PretrainingBatches(paths, SEQ, PRED, 8, shuffle=False, repeat=False))

    def no_batch_decoder(*args, **kwargs):
        raise AssertionError("the batch decoder in the pure-Python baseline")
    monkeypatch.setattr(example, "_decode_batch_c", no_batch_decoder)
    monkeypatch.setattr(example, "_decode_batch_py", no_batch_decoder)
    monkeypatch.setattr(loader, "_Reader", loader_throughput.RecordByRecord)
    got = list(loader.PretrainingBatches(paths, SEQ, PRED, 8, shuffle=False, repeat=False))
    assert len(got) == len(want) == 13
    for a, b in zip(got, want):
        assert a.keys() == b.keys() and all(torch.equal(a[k].to(b[k].dtype), b[k]) for k in a)


def test_a_full_dev_shm_is_one_line_not_a_hang(shards, monkeypatch):
    """A container's /dev/shm is 64 MB unless given more: full, the worker's batch could not be moved
    to shared memory in its queue's feeder thread, which printed a traceback and dropped it, and
    the trainer waited for it forever (SIGTERM too). Full before the workers, the iterator's
    semaphores failed it half made: "no space left on device ... free space", and __del__'s traceback."""
    import errno
    import signal

    paths, _ = shards

    def full(*a, **k):
        raise RuntimeError("unable to allocate shared memory(shm) for file </torch_1_2_3>: No space left on device (28)")

    def timeout(signum, frame):
        raise TimeoutError("the loader hung")

    monkeypatch.setattr(torch.UntypedStorage, "_share_fd_cpu_", full)  # the workers are forked with it
    old = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(20)
    try:
        with pytest.raises(UserError, match=r"^/dev/shm \(\d+ kB\) is full: .*--shm-size=1g \(or --ipc=host.*"
                                            r"--num_workers=0$"):
            next(iter(loader.make_loader(loader.PretrainingBatches(paths, SEQ, PRED, 6), num_workers=1)))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    monkeypatch.undo()

    def no_semaphore():
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(multiprocessing, "Lock", no_semaphore)
    with pytest.raises(UserError, match=r"^/dev/shm \(\d+ kB\) is full: .*--shm-size=1g"):
        loader.make_loader(loader.PretrainingBatches(paths, SEQ, PRED, 6), num_workers=2)

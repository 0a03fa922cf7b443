import contextlib
import os
import threading

import numpy as np
import pytest

from mlperf_bert.dataset import example
from mlperf_bert.dataset import tfrecord
from mlperf_bert.errors import UserError


def test_golden_records_roundtrip_through_our_codec(golden_dir):
    path = os.path.join(golden_dir, "part-00000.s128.tfrecord")
    for i, rec in enumerate(tfrecord.read_records(path)):
        f = example.decode_pretraining_example(rec, 128, 20, "golden")
        again = example.encode_example([(n, k, f[n]) for n, k, _ in example.PRETRAINING_FEATURES])
        assert example.decode_example(again).keys() == f.keys()
        assert len(again) == len(rec)  # same packed encoding as the reference, only the map order differs
        if i == 50:
            break
    assert f["input_ids"][0] == 101 and f["masked_lm_weights"].dtype == np.float32


def test_writer_is_atomic_and_reader_names_corruption(tmp_path):
    recs = [bytes([i]) * (i + 1) for i in range(10)]
    out = tmp_path / "x.tfrecord"
    with pytest.raises(RuntimeError):
        with tfrecord.TFRecordWriter(str(out)) as w:
            w.write(recs[0])
            raise RuntimeError("killed")
    assert not out.exists() and os.listdir(tmp_path) == []
    assert tfrecord.write_records(str(out), recs) == 10
    assert list(tfrecord.read_records(str(out))) == recs
    data = bytearray(out.read_bytes())
    data[40] ^= 1  # inside record 2 or so
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"bad.tfrecord: record \d+ (is corrupt|has a corrupt length)"):
        list(tfrecord.read_records(str(bad)))
    trunc = tmp_path / "trunc.tfrecord"
    trunc.write_bytes(out.read_bytes()[:-3])
    with pytest.raises(UserError, match=r"trunc.tfrecord: record 9 is truncated"):
        list(tfrecord.read_records(str(trunc)))
    with pytest.raises(UserError, match=r"trunc.tfrecord: record 9 is truncated"):
        tfrecord.count_records(str(trunc))
    assert tfrecord.count_records(str(out)) == 10
    assert [n for _, n in tfrecord.scan_records(str(out))] == [len(r) for r in recs]
    huge = tmp_path / "huge.tfrecord"  # a corrupt length must not become a huge read, even unverified
    huge.write_bytes(b"\xff" * 8 + out.read_bytes()[8:])
    with pytest.raises(UserError, match=r"huge.tfrecord: record 0 is truncated"):
        list(tfrecord.read_records(str(huge), verify=False))
    with pytest.raises(UserError, match=r"huge.tfrecord: record 0 has a corrupt length"):
        tfrecord.count_records(str(huge))


def test_packed_varint_decoder_matches_python():
    vals = np.array([0, 1, 127, 128, 300, 16383, 16384, 30521, 2**40], dtype=np.int64)
    buf = b"".join(example._varint(int(v)) for v in vals)
    assert example.decode_packed_varints(buf).tolist() == vals.tolist()


def test_a_json_file_caught_by_a_glob_is_named_as_no_tfrecord(golden_dir, tmp_path):
    """Issue 33: a JSON file an input glob caught was called a damaged TFRecord (a corrupt length)."""
    import json
    import shutil
    from mlperf_bert.dataset import packing
    from mlperf_bert.trainer import training
    from test_training import TINY, flags_for
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(os.path.join(golden_dir, "part-00000.s128.tfrecord"), str(data / "part-00000"))
    info = str(data / "info.json")
    with open(info, "w") as f:
        json.dump({"records": 4366}, f)
    config = str(tmp_path / "config.json")
    with open(config, "w") as f:
        json.dump(TINY, f)
    message = ("%s is not a TFRecord or HDF5 file (it starts with text: '{\"records\": '): if a glob named it, narrow "
               "the glob to the data files" % info)
    runs = [lambda: training.main(flags_for({"config": config, "train": str(data / "*")}, str(tmp_path / "out"),
                                            max_predictions_per_seq=20, num_train_steps=2)),
            lambda: packing.main(["pack", "--input=%s/*" % data, "--output_dir=%s" % (tmp_path / "packed"),
                                  "--max_seq_length=128", "--max_predictions_per_seq=20", "--noprogress"])]
    for run in runs:
        with pytest.raises(UserError) as e:
            run()
        assert str(e.value) == message
    # a TFRecord damaged in its first header is still called damaged
    bad = str(tmp_path / "bad")
    with open(os.path.join(golden_dir, "part-00000.s128.tfrecord"), "rb") as f:
        head = bytearray(f.read(100))
    head[9] ^= 1
    with open(bad, "wb") as f:
        f.write(bytes(head))
    with pytest.raises(UserError, match="bad: record 0 has a corrupt length .CRC mismatch.: the file is damaged"):
        list(tfrecord.scan_records(bad))


def test_tensorflows_compressed_tfrecords_are_named_with_a_fix_that_works(tmp_path):
    """A hostile sweep: a TFRecord file TensorFlow wrote with compression_type ZLIB (a zlib stream, no
    magic number) was "record 0 has a corrupt length: the file is damaged, regenerate or re-download it",
    and one with GZIP (named as the writer's user chose, no .gz) "gunzip it first", which gunzip refuses
    ("unknown suffix -- ignored"). Each says what it is and a command that unpacks it as named."""
    import gzip
    import subprocess
    import sys
    import zlib
    plain = tmp_path / "plain"
    tfrecord.write_records(str(plain), [b"a" * 40, b"b" * 7])
    zl, gz = tmp_path / "part-00000 z", tmp_path / "part-00001"
    zl.write_bytes(zlib.compress(plain.read_bytes()))
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    with pytest.raises(UserError) as e:
        list(tfrecord.scan_records(str(zl)))
    assert str(e.value).startswith("%s is a ZLIB-compressed TFRecord file (TensorFlow's compression_type ZLIB), "
                                   "which this project does not read: decompress it first (python3 -c " % zl)
    command = str(e.value).split("first (", 1)[1][:-1].replace("python3", sys.executable, 1)
    assert command.endswith(" > FILE")
    out = tmp_path / "FILE"
    subprocess.run(command.replace("> FILE", "> %s" % out), shell=True, check=True, cwd=tmp_path)
    assert out.read_bytes() == plain.read_bytes()
    with pytest.raises(UserError) as e:
        list(tfrecord.read_records(str(gz)))
    assert str(e.value) == "%s is gzip-compressed: decompress it first (gunzip -c %s > FILE)" % (gz, gz)


@contextlib.contextmanager
def writerless_fifo(path, patience=5.0):
    """A named pipe at ``path`` that no process writes to: opening it to read waits for a writer (the
    hang of a command given one). Should the code under test open it (as the old code did), after
    ``patience`` seconds a writer opens and closes it, again and again, so that the read ends and the
    test fails instead of waiting for ever."""
    os.mkfifo(path)
    done = threading.Event()

    def unblock():
        if done.wait(patience):
            return
        while not done.wait(0.05):
            with contextlib.suppress(OSError):  # (ENXIO: no reader has it open now)
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    thread = threading.Thread(target=unblock, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        done.set()
        thread.join()


def test_a_named_pipe_or_a_device_among_the_inputs_is_refused_at_once(tmp_path):
    """A hostile sweep: a named pipe (FIFO) with no writer, given as input (or caught by a glob), made
    to-hdf5, pack and the trainer wait for ever as they opened it. expand_paths, which every reader of
    a list of inputs calls, refuses what is no regular file; the generator's text alone may be a pipe
    (read once, as the reference reads it: --input_file=<(zcat part.gz))."""
    fifo = str(tmp_path / "part-00001")
    os.mkfifo(fifo)
    tfrecord.write_records(str(tmp_path / "part-00000"), [b"x"])
    for spec, path, kind in ((str(tmp_path / "part-*"), fifo, "a named pipe (FIFO)"),
                             ("/dev/null", "/dev/null", "a character device")):
        with pytest.raises(UserError) as e:
            tfrecord.expand_paths(spec, "--input file")
        assert str(e.value) == "--input file %s is %s, not a regular file: give the path of a regular file" % (
            path, kind)
    assert tfrecord.expand_paths(str(tmp_path / "part-*"), pipes=True) == [str(tmp_path / "part-00000"), fifo]
    with pytest.raises(UserError, match="is a character device"):
        tfrecord.expand_paths("/dev/null", pipes=True)


def test_a_killed_writes_temporary_is_refused_where_globs_are_expanded(tmp_path):
    """A hostile sweep: a killed make-dataset leaves part-N.tmp-PID beside the finished shards, and a
    glob such as part-* matched it: its records, cut at a record's end, all pass their CRCs, so the
    trainer trained on it and pack packed it. expand_paths (every reader's) refuses it, once, where a
    glob matched it."""
    d = tmp_path / "tfrecords"
    d.mkdir()
    tfrecord.write_records(str(d / "part-00000-of-00002"), [b"x"])
    tmp = str(d / "part-00001-of-00002.tmp-4242")
    tfrecord.write_records(tmp, [b"y"])
    start = ("input file %s is the temporary of an unfinished write of part-00001-of-00002 (process 4242: still "
             "running, or killed): let it end, or rerun the command that makes part-00001-of-00002 (make-dataset "
             "goes on where it stopped)" % tmp)
    with pytest.raises(UserError) as e:
        tfrecord.expand_paths(str(d / "part-*"))
    assert str(e.value) == start + "; or narrow the glob"
    # given by its name, a file named so is the user's own (a review: wiki.tmp-2023, refused as process 2023's)
    assert tfrecord.expand_paths(tmp) == [tmp]
    os.remove(tmp)
    tfrecord.write_records(str(d / "part-00001-of-00002.tmp-x"), [b"y"])  # not a temporary's name: an input
    assert len(tfrecord.expand_paths(str(d / "part-*"))) == 2


def test_a_file_whose_name_holds_a_comma_is_named_with_the_glob_that_gives_it(tmp_path):
    """A hostile sweep: --input_file=DIR/a,b (a file of that name; the lists split at ',') was "input file
    DIR/a does not exist", though the file the user gave does: said, with a glob that gives it (each ','
    a '?'; other glob characters escaped), which reads it."""
    for name in ("a,b", "x,[1],y"):
        path = str(tmp_path / name)
        tfrecord.write_records(path, [b"x"])
        other = str(tmp_path / "other")
        tfrecord.write_records(other, [b"y"])
        for spec in (path, other + "," + path, path + ", " + other):
            with pytest.raises(UserError) as e:
                tfrecord.expand_paths(spec)
            fix = str(tmp_path / name.replace(",", "?").replace("[", "[[]"))
            assert str(e.value) == ("input file %s does not exist (check the path or glob); %s exists, but the list "
                                    "is split at each ',': give it by a glob, e.g. %s"
                                    % (path.split(",")[0], path, fix)), spec
            assert tfrecord.expand_paths(fix) == [path]
        os.remove(path)
    with pytest.raises(UserError) as e:
        tfrecord.expand_paths(str(tmp_path / "a") + "," + other)
    assert str(e.value) == "input file %s does not exist (check the path or glob)" % (tmp_path / "a")


def test_a_killed_downloads_partial_file_is_refused_where_globs_are_expanded(tmp_path):
    """A hostile sweep: a killed `download` leaves part-N.partial (and its record part-N.partial.source)
    beside the finished shards; part-* took the partial file, cut at a record's end, for a shard (its
    CRCs pass) where its record was gone, and called the record "not a TFRecord" (narrow the glob)."""
    tfrecord.write_records(str(tmp_path / "part-00000-of-00002"), [b"x"])
    partial = str(tmp_path / "part-00001-of-00002.partial")
    tfrecord.write_records(partial, [b"y"])
    with pytest.raises(UserError) as e:
        tfrecord.expand_paths(str(tmp_path / "part-*"))
    assert str(e.value) == ("input file %s is the file of an unfinished download of part-00001-of-00002 (cut off, "
                            "killed or still running): run the same download again to finish it; or narrow the "
                            "glob" % partial)
    assert tfrecord.expand_paths(partial) == [partial]  # given by its name: the user's own

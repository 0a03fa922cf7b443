"""create_pretraining_data gives the reference's records: golden digests, an independent
transcription of the reference algorithm on unseen text, C kernel == pure Python, errors."""
import errno
import json
import os
import random
import re
import subprocess
import sys

import numpy as np
import pytest

from mlperf_bert.dataset import pretraining_data
from mlperf_bert.errors import UserError
from mlperf_bert.dataset.example import PRETRAINING_FEATURES, decode_example, decode_pretraining_batch
from mlperf_bert.dataset.pretraining_data import create_pretraining_data, main
from mlperf_bert.dataset.tfrecord import read_records
from mlperf_bert.dataset.tokenization import FastTokenizer, FullTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = [False] + ([True] if pretraining_data._fastrng is not None else [])


def reference_instances(input_files, tokenizer, max_seq_length, max_predictions_per_seq,
                        masked_lm_prob, seed, dupe_factor, short_seq_prob):
    """Plain transcription of the reference create_training_instances (token strings, random.Random)."""
    rng = random.Random(seed)
    docs = [[]]
    for path in input_files:
        with open(path, encoding="utf-8", newline="\n") as f:
            for line in f:
                line = line.replace("\r", "").strip()  # TF's GFile.readline drops every "\r" (test_lines_are_read_as_tfs_gfile_reads_them)
                if not line:
                    docs.append([])
                tokens = tokenizer.tokenize(line)
                if tokens:
                    docs[-1].append(tokens)
    docs = [d for d in docs if d]
    rng.shuffle(docs)
    vocab_words = list(tokenizer.vocab.keys())
    instances = []
    for _ in range(dupe_factor):
        for di in range(len(docs)):
            doc = docs[di]
            max_num = max_seq_length - 3
            target = max_num
            if rng.random() < short_seq_prob:
                target = rng.randint(2, max_num)
            chunk, length, i = [], 0, 0
            while i < len(doc):
                chunk.append(doc[i])
                length += len(doc[i])
                if i == len(doc) - 1 or length >= target:
                    a_end = 1
                    if len(chunk) >= 2:
                        a_end = rng.randint(1, len(chunk) - 1)
                    a = [t for s in chunk[:a_end] for t in s]
                    b = []
                    if len(chunk) == 1 or rng.random() < 0.5:
                        is_random = True
                        for _ in range(10):
                            r = rng.randint(0, len(docs) - 1)
                            if r != di:
                                break
                        for j in range(rng.randint(0, len(docs[r]) - 1), len(docs[r])):
                            b.extend(docs[r][j])
                            if len(b) >= target - len(a):
                                break
                        i -= len(chunk) - a_end
                    else:
                        is_random = False
                        b = [t for s in chunk[a_end:] for t in s]
                    while len(a) + len(b) > max_num:
                        trunc = a if len(a) > len(b) else b
                        if rng.random() < 0.5:
                            del trunc[0]
                        else:
                            trunc.pop()
                    tokens = ["[CLS]"] + a + ["[SEP]"] + b + ["[SEP]"]
                    segs = [0] * (len(a) + 2) + [1] * (len(b) + 1)
                    cands = [k for k, t in enumerate(tokens) if t not in ("[CLS]", "[SEP]")]
                    rng.shuffle(cands)
                    out = list(tokens)
                    num = min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))
                    lms = []
                    for k in cands:
                        if len(lms) >= num:
                            break
                        if rng.random() < 0.8:
                            out[k] = "[MASK]"
                        elif rng.random() < 0.5:
                            out[k] = tokens[k]
                        else:
                            out[k] = vocab_words[rng.randint(0, len(vocab_words) - 1)]
                        lms.append((k, tokens[k]))
                    lms.sort()
                    instances.append((out, segs, lms, is_random))
                    chunk, length = [], 0
                i += 1
    rng.shuffle(instances)
    L, P = max_seq_length, max_predictions_per_seq
    feats = []
    for out, segs, lms, is_random in instances:
        ids = tokenizer.convert_tokens_to_ids(out)
        n, k = len(ids), len(lms)
        feats.append({
            "input_ids": ids + [0] * (L - n), "input_mask": [1] * n + [0] * (L - n),
            "segment_ids": segs + [0] * (L - n),
            "masked_lm_positions": [p for p, _ in lms] + [0] * (P - k),
            "masked_lm_ids": tokenizer.convert_tokens_to_ids([t for _, t in lms]) + [0] * (P - k),
            "masked_lm_weights": [1.0] * k + [0.0] * (P - k), "next_sentence_labels": [int(is_random)]})
    return feats


@pytest.fixture(scope="module")
def unseen_inputs(tmp_path_factory, golden_dir):
    """Two files of text the fixtures never used: golden part-00001 lines plus odd Unicode."""
    d = tmp_path_factory.mktemp("unseen")
    with open(os.path.join(golden_dir, "input", "part-00001-of-00004"), encoding="utf-8") as f:
        lines = f.read().split("\n")[:700]
    extra = ["ΟΔΥΣΣΕΥΣ came HOME.\tNaïve café — 東京 is big.", "\x00\u200b\u00a0 ", "",
             "One line doc.", "", "", "Σ" * 250 + " long word", "x\r\ny", "It was a mid\rline carriage return.", "last"]
    (d / "a.txt").write_text("\n".join(lines[:400]) + "\n", encoding="utf-8")
    (d / "b.txt").write_text("\n".join(lines[400:] + extra), encoding="utf-8")  # no final newline
    return [str(d / "a.txt"), str(d / "b.txt")]


@pytest.mark.parametrize("fast", KERNELS)
def test_matches_reference_transcription_on_unseen_text(tmp_path, unseen_inputs, vocab_file, fast):
    kw = dict(max_seq_length=64, max_predictions_per_seq=10, masked_lm_prob=0.2, random_seed=7,
              dupe_factor=3, short_seq_prob=0.3)
    outs = [str(tmp_path / "o1"), str(tmp_path / "o2"), str(tmp_path / "o3")]
    n = create_pretraining_data(",".join(unseen_inputs), ",".join(outs), vocab_file, progress=False,
                                fast=fast, **kw)
    expected = reference_instances(unseen_inputs, FullTokenizer(vocab_file), kw["max_seq_length"],
                                   kw["max_predictions_per_seq"], kw["masked_lm_prob"], kw["random_seed"],
                                   kw["dupe_factor"], kw["short_seq_prob"])
    assert n == len(expected) > 100
    per_file = [list(read_records(p)) for p in outs]
    assert [len(r) for r in per_file] == [len(expected[w::3]) for w in range(3)]  # round robin
    for w, records in enumerate(per_file):
        for rec, exp in zip(records, expected[w::3]):
            got = decode_example(rec)
            assert list(got) == [name for name, _, _ in PRETRAINING_FEATURES]  # fixed order
            for name, value in exp.items():
                np.testing.assert_array_equal(got[name], np.asarray(value, dtype=got[name].dtype), name)


@pytest.mark.parametrize("fast", KERNELS)
def test_lines_are_read_as_tfs_gfile_reads_them(tmp_path, vocab_file, fast):
    """A hostile sweep: a "\\r" inside a line ("mid\\rline") gave "mid line" where the reference read
    "midline" ("mid ##line"): its tf.gfile.GFile.readline drops every "\\r" byte (one text of many "\\r":
    218 records against our 250). The documents of read_documents are the tokens of the lines TF reads."""
    import tensorflow as tf
    text = ("It was a mid\rline carriage return.\r\nA second\r line.\n\r\n\rNew doc\r\r here.\n"
            "\r\n\nLast\rdoc\r")
    path = tmp_path / "cr.txt"
    path.write_bytes(text.encode("utf-8"))
    tok = FullTokenizer(vocab_file)  # the reference's tokenizer on the lines TF reads
    docs, reader = [[]], tf.io.gfile.GFile(str(path), "r")
    while True:
        line = reader.readline()
        if not line:
            break
        line = line.strip()
        if not line:
            docs.append([])
        ids = tok.convert_tokens_to_ids(tok.tokenize(line))
        if ids:
            docs[-1].append(ids)
    want = [d for d in docs if d]
    corpus = pretraining_data.read_documents([str(path)], FastTokenizer(vocab=tok.vocab), fast=fast)
    got = []
    for d in range(len(corpus.doc_seg) - 1):
        doc = []
        for s in range(corpus.doc_seg[d], corpus.doc_seg[d + 1]):
            doc.append(list(corpus.tokens[corpus.seg_off[s]:corpus.seg_off[s + 1]]))
        got.append(doc)
    assert got == want and len(want) == 3


def test_a_vocab_is_read_as_the_mlcommons_reference_reads_it(tmp_path, vocab_file):
    """A hostile sweep: a vocab with a token on two lines gave it the id of its last line
    (google-research/bert's load_vocab); MLCommons' reference (mlcommons/training
    retired_benchmarks/bert/cleanup_scripts/tokenization.py, load_vocab: ``if token not in vocab:
    vocab[token] = len(vocab)``) keeps the first and counts ids over distinct tokens, and reads the
    file through GFile (a "\\r" dropped). "the" doubled: 1996 there, 30522 here before."""
    from mlperf_bert.dataset.tokenization import load_vocab
    lines = open(vocab_file, encoding="utf-8").read().split("\n")[:-1]
    dup = tmp_path / "vocab_dup.txt"
    dup.write_text("\n".join(lines[:5] + ["the", "x\ry"] + lines[5:]) + "\n", encoding="utf-8")
    vocab = load_vocab(str(dup))
    first = {}
    for t in lines[:5] + ["the", "xy"] + lines[5:]:
        first.setdefault(t.strip(), len(first))
    assert vocab == first and vocab["the"] == 5 and vocab["xy"] == 6 and len(vocab) == len(set(lines)) + 1


HOSTILE_TEXT = (  # 869 bytes: BOM, accents, CJK, NBSP, zero-width, astral, controls, "\r", U+2028/2029, long words
    "\ufeffCaf\u00e9 na\u0131\u0308ve \u00c9COLE r\u00e9sum\u00e9 \u4e2d\u6587\u6d4b\u8bd5\u3002\u6211\u7231\u5317\u4eac\uff01\r\n"
    "Zero\u200bwidth\u00a0nbsp\u3000ideographic tab\there \U0001F600\U0001F44D\U0001D400 end.\n"
    "   \t \u2028\n"
    "A ctl\x01char, a NUL\x00byte and mid\rline \x85next \u2029para.\n"
    "\n\n\n"
    + "x" * 201 + " " + "ab" * 100 + " \u00e9" * 3 + " [SEP] [MASK] ##s [unused5].\n"
    "\u00a0\u3000\n"
    "One.\n"
    "\n"
    "Word\n"
    "\n"
    "The quick brown fox jumps over the lazy dog, \u201cquoted\u201d \u2014 dash\u2026 "
    "\uff08\u62ec\u53f7\uff09\u3001\u300a\u4e66\u300b.\n"
    "Second sentence of the last document has several ordinary words in it.\n"
    "Third sentence, with numbers 1,234.56 and 7-8 hyphens.")  # no final newline


@pytest.mark.parametrize("fast", KERNELS)
@pytest.mark.parametrize("flags, records, digest", [
    (dict(random_seed=12345), 24, "8878d0b4412b1dab7e9c9099d67da8355c667f92aefc4c7d4eaac9a7e29bd2c0"),
    (dict(do_lower_case=False, short_seq_prob=0.5, masked_lm_prob=0.3, random_seed=7), 26,
     "b19ebd4601df2eb2d0a442aeb5306a00c656eae40668482f9771bba02c0ec77d")], ids=["lower", "cased"])
def test_hostile_text_gives_the_mlcommons_references_records(tmp_path, vocab_file, fast, flags, records, digest):
    """Digests measured by running the real reference (mlcommons/training aa344c7f,
    retired_benchmarks/bert/cleanup_scripts/create_pretraining_data.py with its tokenization.py,
    under TF 2.21 with ``tensorflow`` aliased to ``tensorflow.compat.v1``, which reproduces the
    golden s128 digest) on HOSTILE_TEXT: ``--vocab_file=tests/data/vocab.txt --max_seq_length=24
    --max_predictions_per_seq=4 --dupe_factor=3`` and the flags below; ``tfrecord_digest.py`` of its output."""
    src, out = tmp_path / "hostile.txt", str(tmp_path / "out.tfrecord")
    src.write_bytes(HOSTILE_TEXT.encode("utf-8"))
    n = create_pretraining_data(str(src), out, vocab_file, max_seq_length=24, max_predictions_per_seq=4,
                                dupe_factor=3, progress=False, fast=fast, **flags)
    assert (n, _records_digest(out)) == (records, digest)


def _records_digest(path):
    """``tfrecord_digest.py``'s digest of a TFRecord file, in-process."""
    import hashlib
    import tfrecord_digest
    total = hashlib.sha256()
    for rec in tfrecord_digest.records(path):
        feats = tfrecord_digest.parse_example(memoryview(rec))
        total.update(hashlib.sha256(tfrecord_digest.canonical(feats).encode()).hexdigest().encode())
    return total.hexdigest()


UNUSED_TEXT = (  # [unusedN] whole, inside other text, out of the vocab (994), upper-cased, split by a dropped char
    "A [unused5] b [unused99999] c [UNUSED5] d x[unused5] e [unused5]. f [unused5]x.\n"
    "Zero [unused\u200b5] width, \u00a0[unused0]\u3000nbsp, [unused993] last [unused994] past [Unused7] mixed.\n"
    "Accent [unused5]\u0301 and ([unused3]) and [unused12][unused13] glued [unused7]\u4e2d cjk.\n"
    "\n"
    "Second doc: [unused5] twice [unused5] and ordinary words to fill a whole sequence here.\n"
    "More ordinary text in the second document, so that sentence pairs are made.\n")


@pytest.mark.parametrize("fast", KERNELS)
@pytest.mark.parametrize("flags, records, digest", [
    (dict(random_seed=12345, preserve_unused_tokens=False), 15,
     "fbc918787dcf3819a4242ede5d64f894459486ddf1aaae6ec959b0b85c08ca30"),
    (dict(random_seed=12345, preserve_unused_tokens=True), 14,
     "c563c4f875e2fff20f3c68e9fee42515e4d8638b2044c6e2ad1574d7450639cd"),
    (dict(do_lower_case=False, short_seq_prob=0.5, masked_lm_prob=0.3, random_seed=7, preserve_unused_tokens=True),
     13, "7937056567a18e4e3e0b425ba034ed1ca671212712ba1e627762f70978b47b97")], ids=["off", "on", "cased-on"])
def test_preserve_unused_tokens_gives_the_mlcommons_references_records(tmp_path, vocab_file, fast, flags, records,
                                                                         digest):
    """A sweep: the reference's ``--preserve_unused_tokens`` (its tokenization.py) was an unknown flag.
    Digests of the real reference (as for HOSTILE_TEXT) on UNUSED_TEXT: ``python run_ref.py
    create_pretraining_data.py --input_file=unused.txt --output_file=out --vocab_file=tests/data/vocab.txt
    --max_seq_length=24 --max_predictions_per_seq=4 --dupe_factor=3`` and the flags below (run_ref.py:
    ``tensorflow`` aliased to ``tensorflow.compat.v1``, then the script run as __main__); "on" also
    through our flag parser."""
    src, out = tmp_path / "unused.txt", str(tmp_path / "out.tfrecord")
    src.write_bytes(UNUSED_TEXT.encode("utf-8"))
    n = create_pretraining_data(str(src), out, vocab_file, max_seq_length=24, max_predictions_per_seq=4,
                                dupe_factor=3, progress=False, fast=fast, **flags)
    assert (n, _records_digest(out)) == (records, digest)
    if flags == dict(random_seed=12345, preserve_unused_tokens=True) and not fast:
        os.remove(out)
        main(["x", "--input_file=%s" % src, "--output_file=%s" % out, "--vocab_file=%s" % vocab_file,
              "--max_seq_length=24", "--max_predictions_per_seq=4", "--dupe_factor=3", "--preserve_unused_tokens"])
        assert _records_digest(out) == digest


def _digest(path, ref_data):
    out = subprocess.run([sys.executable, os.path.join(ref_data, "tools", "tfrecord_digest.py"), path],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def _golden(golden_dir, name):
    with open(os.path.join(golden_dir, "digests.jsonl")) as f:
        return next(row for row in map(json.loads, f) if row["file"] == name)


def test_golden_s128_digest_and_byte_stability(tmp_path, ref_data, golden_dir, vocab_file):
    out1, out2 = str(tmp_path / "a"), str(tmp_path / "b")
    for out in (out1, out2):
        subprocess.run([sys.executable, os.path.join(ROOT, "create_pretraining_data.py"),
                        "--input_file=%s/input/part-00000-of-00004" % golden_dir, "--output_file=" + out,
                        "--vocab_file=" + vocab_file, "--do_lower_case=True", "--masked_lm_prob=0.15",
                        "--random_seed=12345", "--max_seq_length=128", "--max_predictions_per_seq=20",
                        "--dupe_factor=2"], check=True, capture_output=True)
    want, got = _golden(golden_dir, "part-00000.s128.tfrecord"), _digest(out1, ref_data)
    assert (got["records"], got["bytes"], got["digest"]) == (want["records"], want["bytes"], want["digest"])
    with open(out1, "rb") as a, open(out2, "rb") as b:
        assert a.read() == b.read()


@pytest.mark.slow
def test_golden_s512_digest(ref_data, golden_dir, golden_s512):
    # the MLPerf command; its byte stability: test_dataset's make-dataset run gives the same bytes
    want, got = _golden(golden_dir, "part-00000.s512.tfrecord"), _digest(golden_s512, ref_data)
    assert (got["records"], got["bytes"], got["digest"]) == (want["records"], want["bytes"], want["digest"])


def test_progress_in_a_log_file_is_lines(golden_s512):
    """A hostile sweep: with stderr in a file (a scheduler's output file, `docker logs`), the data
    tools' bars were tqdm's terminal redraws: carriage returns, block characters, every redraw of a
    bar on one line without its newline (an error after it joined that line). The generator's own
    stderr, progress on (the default), to a file: ASCII lines, each bar state on its own line."""
    err = open(golden_s512 + ".stderr", "rb").read()
    assert b"\r" not in err and err.endswith(b"\n") and err.isascii(), err[-500:]
    lines = err.decode().splitlines()
    from mlperf_bert.dataset.tfrecord import count_records
    bars = [line for line in lines if re.search(r"\d+%\|[# 0-9]*\|", line)]
    assert bars and lines[-1] == "wrote %d records to %s" % (count_records(golden_s512), golden_s512), lines[-3:]


def test_a_bar_on_a_terminal_is_tqdms_and_in_a_file_a_line_per_redraw():
    """progress.bar: tqdm's redraws on a terminal; elsewhere a line per redraw, at most every
    FILE_INTERVAL_S seconds of updates (tqdm's monitor does not redraw in between), ASCII."""
    import io
    from mlperf_bert import progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    term, log = Terminal(), io.StringIO()
    for out in (term, log):
        with progress.bar(total=3, desc="t", file=out) as b:
            for _ in range(3):
                b.update(1)
    assert "\r" in term.getvalue()
    assert "\r" not in log.getvalue() and log.getvalue().isascii()
    assert [line.split("|")[0] for line in log.getvalue().splitlines()] == ["t:   0%", "t: 100%"]
    with progress.bar(total=3, file=io.StringIO()) as b:
        assert (b.mininterval, b.maxinterval, b.ascii) == (progress.FILE_INTERVAL_S, float("inf"), True)


def test_a_bar_in_a_file_keeps_its_lines_and_times_when_the_wall_clock_steps_back(monkeypatch):
    """A clock sweep: NTP stepping the clock an hour back mid-bar (tqdm timed on time.time) left a log
    without a bar line for that hour and ended it "[-43:30<00:00, -0.04it/s]"."""
    import io
    import time
    import tqdm.std
    from mlperf_bert import progress
    wall, steady = [1000.0], [50.0]
    monkeypatch.setattr(tqdm.std, "time", lambda: wall[0])
    monkeypatch.setattr(time, "monotonic", lambda: steady[0])
    out = io.StringIO()
    with progress.bar(total=100, desc="t", file=out) as b:
        for i in range(100):
            wall[0] += -3600 if i == 50 else 10
            steady[0] += 10
            b.update(1)
    lines = out.getvalue().splitlines()
    assert len(lines) == 35 and "-" not in lines[-1], lines[-3:]
    assert lines[-1].endswith("100/100 [16:40<00:00, 10.00s/it]"), lines[-1]


@pytest.mark.skipif(len(KERNELS) < 2, reason="the C kernel is not built")
def test_c_kernel_equals_python_kernel(tmp_path, golden_dir, vocab_file):
    outs = []
    for fast in (False, True):
        out = str(tmp_path / ("o%d" % fast))
        create_pretraining_data(golden_dir + "/input/part-0000*-of-00004", out, vocab_file,
                                max_seq_length=128, max_predictions_per_seq=20, dupe_factor=1,
                                short_seq_prob=0.5, random_seed=3, progress=False, fast=fast)
        outs.append(open(out, "rb").read())
    assert outs[0] == outs[1]


@pytest.mark.parametrize("fast", KERNELS)
def test_batch_decoder_matches_example_decoder(golden_dir, fast):
    records = list(read_records(os.path.join(golden_dir, "part-00000.s128.tfrecord")))[:300]
    batch = decode_pretraining_batch(records, 128, 20, fast=fast)
    assert {k: (v.shape, v.dtype.name) for k, v in batch.items()} == {
        "input_ids": ((300, 128), "int32"), "input_mask": ((300, 128), "int32"),
        "segment_ids": ((300, 128), "int32"), "masked_lm_positions": ((300, 20), "int32"),
        "masked_lm_ids": ((300, 20), "int32"), "masked_lm_weights": ((300, 20), "float32"),
        "next_sentence_labels": ((300, 1), "int32")}
    for i in (0, 7, 299):
        one = decode_example(records[i])  # the golden file's feature order is arbitrary
        for name, arr in batch.items():
            np.testing.assert_array_equal(arr[i], one[name].astype(arr.dtype))
    with pytest.raises(UserError, match="record 2: malformed"):
        decode_pretraining_batch(records[:2] + [records[2][:-3]], 128, 20, fast=fast)
    with pytest.raises(UserError, match="record 1: feature input_ids is missing"):
        decode_pretraining_batch(records[:1] + [b""], 128, 20, fast=fast)
    with pytest.raises(UserError, match=r"record 0: feature \w+ has 128 values, expected 512"):
        decode_pretraining_batch(records[:2], 512, 20, fast=fast)


@pytest.mark.parametrize("fast", KERNELS)
def test_batch_decoder_refuses_values_past_int32_and_features_of_another_kind(tiny_record, fast):
    """A hostile review: int64 values past int32 were wrapped (input_ids 2**32 + 5 trained as 5,
    input_mask 2**31 + 1 refused as 'holds -2147483647'), and the per-record decoder turned float
    input_ids 1.5 into 1: each is refused with the true value, as tf.parse_single_example refuses a
    feature of the wrong kind, the record named by ``where``."""
    ok = tiny_record(input_ids=[-2**31, 2**31 - 1] + [5] * 6)  # int32's bounds (a negative id: values_refusal's)
    assert decode_pretraining_batch([ok, ok], 8, 2, fast=fast, check_values=False)["input_ids"][1, :2].tolist() == [
        -2**31, 2**31 - 1]
    for name, values, why in [("input_ids", [2**32 + 5] + [5] * 7, "holds 4294967301, outside int32"),
                              ("input_mask", [1] * 7 + [2**31 + 1], "holds 2147483649, outside int32"),
                              ("masked_lm_ids", [7, -2**31 - 1], "holds -2147483649, outside int32"),
                              ("next_sentence_labels", [2**32], "holds 4294967296, outside int32"),
                              ("input_ids", ("float", [1.5] * 8), "holds float values, not int64"),
                              ("masked_lm_weights", ("int64", [1, 1]), "holds int64 values, not float")]:
        with pytest.raises(UserError) as e:
            decode_pretraining_batch([ok, ok, tiny_record(**{name: values})], 8, 2, where="f: record {}".format,
                                     fast=fast, check_values=False)
        assert str(e.value).startswith("f: record 2: feature %s %s: " % (name, why)), str(e.value)
        assert "\n" not in str(e.value)


def _run_error(argv):
    with pytest.raises(UserError) as e:
        main(["create_pretraining_data.py"] + argv)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_errors_are_one_line(tmp_path, vocab_file):
    text = tmp_path / "in.txt"
    text.write_text("Hello world.\nSecond line.\n\nAnother doc.\n", encoding="utf-8")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n\x00\n", encoding="utf-8")
    out = str(tmp_path / "out.tfrecord")
    base = ["--vocab_file=" + vocab_file, "--output_file=" + out]
    assert "does not exist" in _run_error(base + ["--input_file=" + str(tmp_path / "nope.txt")])
    assert "no documents" in _run_error(base + ["--input_file=" + str(empty)])
    bad_vocab = tmp_path / "v.txt"
    bad_vocab.write_text("a\nb\n")
    assert "not a BERT vocab" in _run_error(["--input_file=" + str(text), "--output_file=" + out,
                                             "--vocab_file=" + str(bad_vocab)])
    assert "cannot read vocab" in _run_error(["--input_file=" + str(text), "--output_file=" + out,
                                              "--vocab_file=" + str(tmp_path / "none.txt")])
    assert "too large" in _run_error(base + ["--input_file=" + str(text), "--max_seq_length=16",
                                             "--max_predictions_per_seq=20"])
    assert "at most 2147483647" in _run_error(base + ["--input_file=" + str(text), "--max_seq_length=2147483648"])
    assert "unexpected argument" in _run_error(base + ["--input_file=" + str(text) + ",", str(text)])
    for outs in (out + ",", "%s,,%s" % (out, out + "2"), "," + out):  # the reference: NotFoundError on ''
        assert "has an empty name" in _run_error(["--input_file=" + str(text), "--vocab_file=" + vocab_file,
                                                  "--output_file=" + outs])
    assert "names a file twice" in _run_error(["--input_file=" + str(text), "--vocab_file=" + vocab_file,
                                               "--output_file=%s,%s" % (out, out)])
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    if not os.access(str(ro), os.W_OK):  # root can write anywhere
        assert "not writable" in _run_error(["--input_file=" + str(text), "--vocab_file=" + vocab_file,
                                             "--output_file=" + str(ro / "x.tfrecord")])
    assert not os.path.exists(out) and os.listdir(str(tmp_path)).count("out.tfrecord") == 0


def test_command_line_exit_status_and_atomic_output(tmp_path, vocab_file):
    out = tmp_path / "o.tfrecord"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "create_pretraining_data.py"),
                        "--input_file=" + str(tmp_path / "missing.txt"), "--output_file=" + str(out),
                        "--vocab_file=" + vocab_file], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error:")
    assert os.listdir(str(tmp_path)) == []


def test_output_that_is_an_input_is_refused(tmp_path, golden_dir, vocab_file):
    """Issue 16.2: outputs never overwrite inputs (the text shard or the vocab), by real path."""
    src = tmp_path / "part-00000"
    src.write_bytes(open(os.path.join(golden_dir, "input", "part-00000-of-00004"), "rb").read())
    before = src.read_bytes()
    os.symlink(str(src), str(tmp_path / "link"))
    for out in ("%s" % src, "%s,%s" % (tmp_path / "other", tmp_path / "link"), vocab_file):
        with pytest.raises(UserError, match="--output_file .* is the input .*: writing it would destroy the input"):
            main(["x", "--input_file=%s" % src, "--output_file=%s" % out, "--vocab_file=%s" % vocab_file])
    assert src.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["link", "part-00000"]


def test_an_output_that_is_a_pipe_or_a_device_is_refused_not_replaced(tmp_path, vocab_file):
    """A hostile sweep: --output_file naming a FIFO (or a device: /dev/null, as root) was replaced by
    a regular file holding the records (the final rename); the reference writes into it. Refused in
    one line, left as it was, as to-hdf5's --output is."""
    import stat
    from mlperf_bert.dataset import hdf5
    text = tmp_path / "in.txt"
    text.write_text("Hello world, one sentence.\nA second one.\n\nAnother document.\n", encoding="utf-8")
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    assert _run_error(["--input_file=%s" % text, "--output_file=%s" % fifo, "--vocab_file=%s" % vocab_file]) == (
        "--output_file %s is a named pipe (FIFO), not a regular file: give the path of a regular file "
        "(it would be replaced by one)" % fifo)
    records = str(tmp_path / "records")
    create_pretraining_data(str(text), records, vocab_file, max_seq_length=8, max_predictions_per_seq=1,
                            dupe_factor=1, progress=False)
    with pytest.raises(UserError, match="--output %s is a named pipe" % fifo):
        hdf5.main(["to-hdf5", "--input=%s" % records, "--output=%s" % fifo, "--max_seq_length=8",
                   "--max_predictions_per_seq=1"])
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and sorted(os.listdir(tmp_path)) == ["fifo", "in.txt", "records"]


@pytest.mark.skipif(len(KERNELS) < 2, reason="the C kernel is not built")
def test_c_kernel_random_stream_is_pythons():
    """The C Mersenne Twister (tempered a block at a time, rejection sampling two words at a
    time) gives random.Random's draws, across block boundaries and for every range width."""
    state = random.Random(12345).getstate()[1]
    c, py = pretraining_data._fastrng.Kernel(state, [5, 6, 7], 1, 2, 3, 8, 2), random.Random(12345)
    rng = random.Random(0)
    for _ in range(5000):
        r = rng.random()
        if r < 0.3:
            assert c.random() == py.random()
        elif r < 0.9:
            hi = rng.choice([1, 2, 3, 255, 256, 257, 511, 512, 513, 30521, 2 ** 31, 2 ** 32 - 1, rng.randint(1, 10 ** 6)])
            assert c.randint(0, hi - 1) == py.randint(0, hi - 1)
        else:
            x = list(range(rng.randint(0, 700)))
            y = list(x)
            c.shuffle(x)
            py.shuffle(y)
            assert x == y
    assert list(c.getstate()) == list(py.getstate()[1])


@pytest.mark.skipif(len(KERNELS) < 2, reason="the C kernel is not built")
def test_instances_are_kept_compact(golden_dir, vocab_file):
    """Issue 26: the generator held every serialized Example (2.7 KB at seq 512, 505 MB for a
    27 MB shard) until the final shuffle; the C kernel keeps ~600 bytes an instance and
    encodes the records as they are written."""
    import array
    import tracemalloc
    from mlperf_bert.dataset.tokenization import load_vocab
    vocab = load_vocab(vocab_file)
    corpus = pretraining_data.read_documents([golden_dir + "/input/part-00000-of-00004"], FastTokenizer(vocab=vocab))
    kernel = pretraining_data.make_kernel(12345, [vocab[w] for w in vocab], vocab["[CLS]"], vocab["[SEP]"],
                                          vocab["[MASK]"], 512, 76)
    tracemalloc.start()
    try:
        kernel.set_corpus(corpus.tokens, corpus.seg_off, array.array("q", corpus.doc_seg[:-1]),
                          array.array("q", corpus.doc_seg[1:]))
        for _ in range(10):
            kernel.documents(0, len(corpus), 0.1, 0.15)
        kernel.shuffle_instances()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    size = sum(kernel.output_sizes(1))
    assert kernel.count > 7000 and size > 18e6  # seq-512 records of 2.6 KB
    assert peak < 0.4 * size, (peak, size)


def test_without_the_c_accelerators(monkeypatch, tmp_path, golden_dir, vocab_file):
    """No compiler: the pure-Python tokenizer and kernel give the same bytes."""
    from mlperf_bert.dataset import tokenization
    inp = golden_dir + "/input/part-00001-of-00004"
    kw = dict(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=1, progress=False)
    create_pretraining_data(inp, str(tmp_path / "a"), vocab_file, **kw)
    monkeypatch.setattr(pretraining_data, "_fastrng", None)
    monkeypatch.setattr(tokenization, "_fasttok", None)
    assert FastTokenizer(vocab_file).corpus_tokenizer() is None
    create_pretraining_data(inp, str(tmp_path / "b"), vocab_file, **kw)
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


class _NoDirect:
    """A file on a file system that takes O_DIRECT in fcntl but refuses direct writes."""

    def __init__(self, f):
        self._f = f

    def write(self, data):
        import fcntl
        if fcntl.fcntl(self._f.fileno(), fcntl.F_GETFL) & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()
        return False


def test_direct_writes_refused_fall_back_to_ordinary_writes(monkeypatch, tmp_path, golden_dir, vocab_file):
    from mlperf_bert import fileio
    inp = golden_dir + "/input/part-00000-of-00004"
    kw = dict(max_seq_length=512, max_predictions_per_seq=76, dupe_factor=3, progress=False)
    create_pretraining_data(inp, "%s,%s" % (tmp_path / "a1", tmp_path / "a2"), vocab_file, **kw)
    real_open = open
    monkeypatch.setattr(fileio, "open", lambda *a, **k: _NoDirect(real_open(*a, **k)), raising=False)
    create_pretraining_data(inp, "%s,%s" % (tmp_path / "b1", tmp_path / "b2"), vocab_file, **kw)
    for a, b in (("a1", "b1"), ("a2", "b2")):
        assert (tmp_path / a).read_bytes() == (tmp_path / b).read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["a1", "a2", "b1", "b2"]


@pytest.mark.skipif(len(KERNELS) < 2, reason="the C kernel is not built")
@pytest.mark.parametrize("mask_id", [103, 3_000_000])  # a 4-byte varint: beyond the C kernel's table
def test_kernels_agree_on_random_corpora(mask_id):
    import array
    rng = random.Random(mask_id)
    vocab_ids = list(range(1000)) + [70000] + ([2 ** 22] if mask_id > 2 ** 21 else [])
    seg_off, tokens = [0], []
    for _ in range(400):
        tokens += [rng.choice(vocab_ids[:1000] + [70000]) for _ in range(rng.randint(1, 40))]
        seg_off.append(len(tokens))
    cuts = sorted(rng.sample(range(1, 400), 30))
    doc_first, doc_stop = [0] + cuts, cuts + [400]
    streams = []
    for fast in (False, True):
        k = pretraining_data.make_kernel(9, vocab_ids, 101, 102, mask_id, 64, 12, fast=fast)
        k.set_corpus(array.array("i", tokens), array.array("q", seg_off), array.array("q", doc_first),
                     array.array("q", doc_stop))
        for _ in range(3):
            k.documents(0, 10, 0.3, 0.2)
            k.documents(10, len(doc_first), 0.3, 0.2)
        k.shuffle_instances()
        chunks, pos, buf = [], 1, bytearray(k.max_record + 600)  # a few records a call
        while pos < k.count:
            n, pos = k.encode_into(buf, pos, 2)
            chunks.append(bytes(buf[:n]))
        streams.append((k.count, k.output_sizes(2), b"".join(chunks)))
    assert streams[0] == streams[1]
    assert streams[0][0] > 100 and len(streams[0][2]) == streams[0][1][1]


@pytest.mark.parametrize("kw, message", [
    (dict(max_seq_length=4), r"--max_seq_length=4 is too small: it must be at least 5"),
    (dict(max_predictions_per_seq=-1), r"--max_predictions_per_seq=-1 is below 0 for --max_seq_length=128: it must "
                                       r"be between 0 and max_seq_length"),  # a sweep: it was "too large"
    (dict(max_predictions_per_seq=129), r"--max_predictions_per_seq=129 is too large for --max_seq_length=128"),
    (dict(masked_lm_prob=1.5), r"--masked_lm_prob=1.5 must be between 0 and 1"),
    (dict(short_seq_prob=float("nan")), r"--short_seq_prob=nan must be between 0 and 1"),
    (dict(dupe_factor=0), r"--dupe_factor=0 must be at least 1"),
])
def test_settings_out_of_range_are_one_line_saying_which_way(kw, message):
    from mlperf_bert.dataset.pretraining_data import check_settings
    args = dict(dict(max_seq_length=128, max_predictions_per_seq=20, masked_lm_prob=0.15, dupe_factor=10,
                     short_seq_prob=0.1), **kw)
    with pytest.raises(UserError, match="^" + message):
        check_settings(**args)


def test_a_c_decoder_built_from_older_sources_is_refused_not_misread(monkeypatch):
    """A review: an in-place _fastrng built before a `git pull` (pip install -e, then pull) wrapped
    int64 values to int32 and its errors were unpacked wrongly (a traceback). Its VERSION is
    checked: one built from other sources is one line saying to rebuild it."""
    import types
    from mlperf_bert.dataset import native
    assert native.fastrng().VERSION == native.FASTRNG_VERSION  # this checkout's build
    old = types.ModuleType("mlperf_bert.dataset._fastrng")
    old.__file__ = "/x/_fastrng.so"
    monkeypatch.setitem(sys.modules, "mlperf_bert.dataset._fastrng", old)
    import mlperf_bert.dataset
    monkeypatch.setattr(mlperf_bert.dataset, "_fastrng", old, raising=False)
    with pytest.raises(UserError) as e:
        native.fastrng()
    assert str(e.value) == ("/x/_fastrng.so was built from other sources than this checkout's _fastrng.c (version 1, "
                            "not %d): rebuild it (make venv, or pip install -e .)" % native.FASTRNG_VERSION)


def test_a_refused_vocab_or_input_leaves_no_folder_this_run_made(tmp_path, vocab_file, golden_dir):
    """create_pretraining_data.py with a missing or wrong vocab, a TFRecord or an empty file given
    as text made the output files' folders (with their parents) and left them empty. The vocab is
    now read before anything is made; an input refused once read removes the folders this run made."""
    from mlperf_bert.dataset.tfrecord import write_records
    text = os.path.join(golden_dir, "input", "part-00000-of-00004")
    bad_vocab, records, empty = tmp_path / "v.txt", str(tmp_path / "records"), tmp_path / "empty.txt"
    bad_vocab.write_text("a\nb\n")
    write_records(records, [b"not text"] * 3)
    empty.write_text("\n \n", encoding="utf-8")
    outs = "%s,%s" % (tmp_path / "new" / "a" / "part-0", tmp_path / "new" / "b" / "part-1")
    for inputs, vocab, why in ((text, str(tmp_path / "none.txt"), "cannot read vocab file %s" % (tmp_path / "none.txt")),
                               (text, str(bad_vocab), "vocab file %s is not a BERT vocab" % bad_vocab),
                               (records, vocab_file, "input file %s is a TFRecord file, not text" % records),
                               (str(empty), vocab_file, "input %s holds no documents" % empty)):
        assert _run_error(["--input_file=" + inputs, "--output_file=" + outs, "--vocab_file=" + vocab,
                           "--max_seq_length=128", "--max_predictions_per_seq=20"]).startswith(why)
        assert not (tmp_path / "new").exists(), why
    # as a user runs it: one line, exit 2, nothing made
    r = subprocess.run([sys.executable, os.path.join(ROOT, "create_pretraining_data.py"), "--input_file=" + records,
                        "--output_file=" + outs, "--vocab_file=" + vocab_file], capture_output=True, text=True,
                       timeout=120)
    assert (r.returncode, r.stdout) == (2, "") and "Traceback" not in r.stderr, r.stderr  # (its progress bar before)
    assert r.stderr.splitlines()[-1] == ("error: input file %s is a TFRecord file, not text: give the text shards "
                                         "(part-XXXXX-of-XXXXX)" % records)
    assert not (tmp_path / "new").exists()


def test_text_and_vocab_from_pipes_are_read_as_from_files(vocab_file, tmp_path):
    """Text and the vocab from pipes with a writer are read, as the reference reads them
    (--input_file=<(zcat part.gz), --vocab_file=<(cat vocab.txt)): records equal to those of the same
    files. (A review: a sweep's refusal of a vocab pipe broke --vocab_file=<(...), which worked.)"""
    import threading
    text = tmp_path / "in.txt"
    text.write_text("Hello world, this is one sentence.\nAnd a second one here.\n\nAnother document now.\n"
                    "With its own second line.\n", encoding="utf-8")
    pipes = {}
    for name, source in (("text", str(text)), ("vocab", vocab_file)):
        pipes[name] = str(tmp_path / ("%s-pipe" % name))
        os.mkfifo(pipes[name])

        def write(pipe=pipes[name], data=open(source, "rb").read()):
            with open(pipe, "wb") as f:
                f.write(data)
        threading.Thread(target=write, daemon=True).start()
    kw = dict(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1, progress=False)
    assert create_pretraining_data(pipes["text"], str(tmp_path / "piped"), pipes["vocab"], **kw) > 0
    create_pretraining_data(str(text), str(tmp_path / "filed"), vocab_file, **kw)
    assert (tmp_path / "piped").read_bytes() == (tmp_path / "filed").read_bytes()


def test_a_sequence_length_no_bert_uses_is_one_line_not_a_memory_error(vocab_file, tmp_path):
    """A hostile sweep: make-dataset --max_seq_length=2000000000 (check_shape allows up to 2**31 - 1)
    ended in a worker's MemoryError traceback (under ulimit -v 8000000): the kernel takes 13 bytes a
    token at its start, and every record is padded to the length. The generator refuses lengths past
    65536 in one line naming the flag; 65536 itself is made."""
    from mlperf_bert.dataset import make_dataset
    text = tmp_path / "text"
    text.mkdir()
    (text / "part-00000-of-00001").write_text("Hello world, one sentence.\nA second one.\n\nAnother document.\n"
                                              "Its second line.\n", encoding="utf-8")
    line = ("--max_seq_length=2000000000 is longer than any BERT's sequences: give at most 65536 (MLPerf uses 512; "
            "every record is padded to this length, and to-hdf5 and pack store positions in 16 bits)")
    with pytest.raises(UserError) as e:
        make_dataset.main(["make-dataset", "--text_dir=%s" % text, "--output_dir=%s" % (tmp_path / "out"),
                           "--vocab_file=%s" % vocab_file, "--workers=1", "--max_seq_length=2000000000",
                           "--noprogress"])
    assert str(e.value) == line
    assert _run_error(["--input_file=%s" % (text / "part-00000-of-00001"), "--output_file=%s" % (tmp_path / "o"),
                       "--vocab_file=%s" % vocab_file, "--max_seq_length=2000000000"]) == line
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()
    assert create_pretraining_data(str(text / "part-00000-of-00001"), str(tmp_path / "long"), vocab_file,
                                   max_seq_length=65536, max_predictions_per_seq=5, dupe_factor=1, progress=False) > 0


def test_the_bench_prints_no_ratio_against_a_reference_it_did_not_run(tmp_path, monkeypatch, capsys):
    """bench/create_pretraining_data.py without --reference printed "142x faster" against the
    reference's 263 s of a busier day, where the README's 70x was measured side by side: a ratio
    is printed only for a reference run in the same invocation (its runs faked here)."""
    import runpy
    bench = os.path.join(ROOT, "bench")
    monkeypatch.syspath_prepend(bench)
    glb = runpy.run_path(os.path.join(bench, "create_pretraining_data.py"))["main"].__globals__

    def run(argv, cwd=None):
        for out in [a.split("=", 1)[1] for a in argv if a.startswith("--output_file=")]:
            with open(out, "wb") as f:
                f.write(b"x")
        return {"wall": 1.0, "cpu": 1.0, "rss_mb": 1.0}
    for name, fake in (("run", run), ("stages", lambda inp, out: [0.1] * 3), ("dd", lambda path, n: 0.1)):
        monkeypatch.setitem(glb, name, fake)
    monkeypatch.setenv("BENCH_TMP", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["create_pretraining_data.py", "--runs=1"])
    glb["main"]()
    out = capsys.readouterr().out
    assert "no ratio" in out and "faster" not in out, out

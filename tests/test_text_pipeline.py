import glob
import hashlib
import os
import random

import pytest

from mlperf_bert.dataset import text_pipeline
from mlperf_bert.errors import UserError
from mlperf_bert.dataset.sentences import split_sentences

NUM_TEST = 22  # not a multiple of 4 files, so per-file counts differ (5, 6, 5, 6)


@pytest.fixture(scope="module")
def wiki_files(ref_data):
    return sorted(glob.glob(os.path.join(ref_data, "data", "wiki_sample", "wiki_*")))


@pytest.fixture(scope="module")
def outputs(wiki_files, tmp_path_factory):
    dirs = []
    for run in range(2):
        d = str(tmp_path_factory.mktemp("text%d" % run))
        text_pipeline.main(["text-pipeline", "--wiki_glob=%s" % os.path.join(os.path.dirname(wiki_files[0]), "wiki_*"),
                            "--output_dir=%s" % d, "--num_test_articles=%d" % NUM_TEST,
                            "--block_size_mb=1.9", "--workers=2"])
        dirs.append(d)
    return dirs


def read(path):
    with open(path, encoding="utf-8", newline="\n") as f:
        return f.read()


def test_cleanup_and_segmentation_reproduce_the_golden_shards(ref_data, wiki_files):
    # The golden shards were made from wiki_00 and wiki_01 with the reference's steps 1-3.
    for k in (0, 1):
        gold = read(os.path.join(ref_data, "golden", "input", "part-0000%d-of-00004" % k))
        assert text_pipeline.segment_file(wiki_files[k]) == gold


def test_outputs_exist_and_are_deterministic(outputs):
    a, b = outputs
    names = sorted(os.listdir(a))
    # 4 files of ~0.93 MB training text each, gathered two by two into 1.9 MiB shards
    assert names == ["eval.md5", "eval.txt", "part-00000-of-00002", "part-00001-of-00002"]
    assert names == sorted(os.listdir(b))
    for n in names:
        assert open(os.path.join(a, n), "rb").read() == open(os.path.join(b, n), "rb").read(), n


def test_eval_md5_lines_are_the_md5s_of_the_eval_articles(outputs):
    text = read(os.path.join(outputs[0], "eval.txt"))
    pieces = text.split("\n\n")
    assert pieces[-1] == ""
    md5s = read(os.path.join(outputs[0], "eval.md5")).splitlines()
    assert len(md5s) == len(pieces) - 1 == NUM_TEST
    for piece, line in zip(pieces[:-1], md5s):
        assert line == hashlib.md5(piece.rstrip().encode("utf-8")).hexdigest()


def test_eval_selection_follows_the_reference_rule(wiki_files, outputs):
    # Recompute the selection from the published rule, independently of the module's code.
    n = len(wiki_files)
    want_eval, want_train = [], []
    for k, path in enumerate(wiki_files):
        articles = text_pipeline.segment_file(path).split("\n\n")
        count = int((k + 1) * NUM_TEST / n) - int(k * NUM_TEST / n)
        rng = random.Random(12345 + 13 * k)
        ids = []
        while len(ids) < count:
            i = int(rng.random() * len(articles))
            if i not in ids:
                ids.append(i)
        assert len(ids) == (5 if k % 2 == 0 else 6)
        want_eval += [a for i, a in enumerate(articles) if i in ids]
        want_train += [a for i, a in enumerate(articles) if i not in ids]
    assert read(os.path.join(outputs[0], "eval.txt")) == "".join(a + "\n\n" for a in want_eval)
    parts = sorted(glob.glob(os.path.join(outputs[0], "part-*")))
    assert "".join(read(p) for p in parts) == "".join(a + "\n\n" for a in want_train)
    # eval articles are absent from the training shards
    train_articles = set("".join(read(p) for p in parts).split("\n\n"))
    for a in want_eval:
        if a.strip():
            assert a not in train_articles


def test_gather_plan_starts_a_new_shard_before_passing_the_block():
    assert text_pipeline.gather_plan([5, 5, 5], 10) == [[0, 1], [2]]
    assert text_pipeline.gather_plan([5, 5, 5], 9.9) == [[0], [1], [2]]
    assert text_pipeline.gather_plan([20, 1], 10) == [[0], [1]]


def test_sentence_rules():
    assert split_sentences("He met Mrs. Ward. Then he left!  Why? no") == [
        "He met Mrs.", "Ward.", "Then he left!", "Why? no"]
    assert split_sentences('It was "Here." This (e.g. in U.S. law) ends.) Next') == [
        'It was "Here." This (e.g. in U.S. law) ends.) Next']
    assert split_sentences("   ") == []


def test_too_few_articles_is_a_user_error(wiki_files, tmp_path):
    with pytest.raises(UserError, match="must give 2500 eval articles"):
        text_pipeline.run(wiki_files, str(tmp_path), num_test_articles=10000, workers=1, progress=False)
    assert not os.path.exists(tmp_path / ".text_pipeline_work")
    with pytest.raises(UserError, match="matches no file"):
        text_pipeline.main(["text-pipeline", "--wiki_glob=%s" % (tmp_path / "none*"),
                            "--output_dir=%s" % tmp_path])
    latin1 = tmp_path / "wiki_00"
    latin1.write_bytes('<doc id="1">\nTitle\nCaf\xe9 au lait.\n</doc>\n'.encode("latin-1"))
    with pytest.raises(UserError, match="wiki_00 is not UTF-8"):
        text_pipeline.run([str(latin1)], str(tmp_path / "out"), num_test_articles=0, workers=1, progress=False)


def test_rerun_with_another_block_size_leaves_only_the_new_shards(wiki_files, outputs, tmp_path):
    d = tmp_path / "rerun"
    for block in (1.9, 0.95):
        parts = text_pipeline.run(wiki_files, str(d), num_test_articles=NUM_TEST, block_size_mb=block,
                                  workers=1, progress=False)
    assert len(parts) == 4
    assert sorted(os.listdir(d)) == ["eval.md5", "eval.txt"] + ["part-%05d-of-00004" % i for i in range(4)]
    # the same training text, now in four shards
    a = outputs[0]
    old = b"".join(open(os.path.join(a, n), "rb").read() for n in sorted(os.listdir(a)) if n.startswith("part-"))
    assert b"".join(open(p, "rb").read() for p in parts) == old

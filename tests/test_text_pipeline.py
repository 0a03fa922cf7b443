"""text-pipeline against the reference text pipeline: the md5s of what process_wiki.sh (NLTK 3.4.5
Punkt) made of the real WikiExtractor sample, sentences the reference split, and the reference's
separation and gather rules on inputs made here, for other test-article counts and block sizes."""
import glob
import hashlib
import os
import random

import pytest

from mlperf_bert.dataset import text_pipeline
from mlperf_bert.dataset.sentences import segment, split_sentences
from mlperf_bert.dataset.wiki_cleanup import clean
from mlperf_bert.errors import UserError

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


@pytest.fixture(scope="module")
def wiki_files(ref_data):
    return sorted(glob.glob(os.path.join(ref_data, "data", "wiki_sample", "wiki_*")))


def md5(path):
    with open(path, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


def test_reference_outputs_byte_for_byte(wiki_files, tmp_path):
    # tests/data/golden/text/MD5SUMS: process_wiki.sh's steps with --num_test_articles=22, --block_size=26.92
    want = dict(reversed(line.split()) for line in open(os.path.join(DATA, "golden", "text", "MD5SUMS")))
    out = tmp_path / "out"
    text_pipeline.main(["text-pipeline", "--wiki_glob=%s" % os.path.join(os.path.dirname(wiki_files[0]), "wiki_*"),
                        "--output_dir=%s" % out, "--num_test_articles=22", "--block_size_mb=26.92", "--workers=2"])
    assert sorted(os.listdir(out)) == ["eval.md5", "eval.txt", "part-00000-of-00500"]
    assert {name: md5(out / name) for name in want} == want
    with open(out / "eval.md5") as f, open(os.path.join(DATA, "golden", "text", "eval.md5")) as g:
        assert f.read() == g.read()


def test_sentences_as_the_reference_split_them():
    # lines of the reference's output (golden part-00000-of-00500) where a regular expression goes wrong
    assert split_sentences('In a later interview, Hitchcock said: "Selznick was the Big Producer.\xa0... '
                           'Producer was king.') == [
        'In a later interview, Hitchcock said: "Selznick was the Big Producer.', "... Producer was king."]
    assert split_sentences("Of these, 10,000 were in Missouri under Missouri State Guard Maj. Gen. Sterling "
                           "Price. Maj. Gen. Polk ignored the problems of the forts when he took command.") == [
        "Of these, 10,000 were in Missouri under Missouri State Guard Maj. Gen. Sterling Price.",
        "Maj. Gen. Polk ignored the problems of the forts when he took command."]
    assert split_sentences('the Voting Rights Act of 1965 by the U.S. Congress. In "Baker v. Carr" (1962) '
                           'the court ruled.') == [
        "the Voting Rights Act of 1965 by the U.S. Congress.", 'In "Baker v. Carr" (1962) the court ruled.']
    assert split_sentences("   \n") == [] and split_sentences("") == []


def test_cleanup_as_the_reference_scripts():
    raw = ('<doc id="1" url="u" title="T">\nT\n\nFirst [[a|link]] and [[plain]] [[File:x.png|thumb]] text.\n'
           '   \n[[Category:Gone]] line\nSecond<ref name="x">cite</ref> line.<br>\n</doc>\n'
           '<doc id="2" url="u" title="U">\nU\nThird.\n</doc>\n')
    # cleanup_file.py: one blank line per article, title and </doc> dropped, white-space lines kept
    # (segmentation drops them); clean.sh: category lines dropped, links keep their text (a piped
    # File link too: its |-rule runs first), tags go
    assert clean(raw) == "\nFirst link and plain thumb text.\n   \nSecond line.\n\nThird.\n"
    assert segment(clean(raw)) == "\nFirst link and plain thumb text.\nSecond line.\n\nThird.\n\n"


def _wiki_file(path, rng, docs, bom=False):
    words = "alpha beta gamma delta Dr. Smith U.S. Army e.g. this etc. that".split()
    with open(path, "w", encoding="utf-8-sig" if bom else "utf-8", newline="") as f:
        for d in range(docs):
            f.write('<doc id="%d" url="x" title="Doc %d">\nDoc %d\n\n' % (d, d, d))
            for _ in range(rng.randint(1, 4)):
                sents = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 9))).capitalize() + rng.choice(".?!")
                         for _ in range(rng.randint(1, 5))]
                f.write(" ".join(sents) + rng.choice(["\n", "\r\n", "\n   \n"]))
            f.write("</doc>\n")


def _reference_rules(files, num_test, block_mib, num_outputs=500):
    """seperate_test_set.py and do_gather.py (nworker 1), serially, over the segmented files."""
    evals, trains = [], []
    for k, path in enumerate(files):
        articles = text_pipeline.segment_file(path).split("\n\n")
        n = int((k + 1) * num_test * 1.0 / len(files)) - int(k * num_test * 1.0 / len(files))
        rng, ids = random.Random(12345 + 13 * k), []
        while len(ids) < n:
            i = int(rng.random() * len(articles))
            if i not in ids:
                ids.append(i)
        evals += [a for i, a in enumerate(articles) if i in ids]
        trains.append("".join(a + "\n\n" for i, a in enumerate(articles) if i not in ids))
    parts, total = [[]], 0
    for path, train in zip(files, trains):
        size = os.path.getsize(path)
        if parts[-1] and block_mib * 1024 * 1024 < total + size:
            parts.append([])
            total = 0
        total += size
        parts[-1].append(train[:-1] if train.endswith("\n\n") else train)
    shards = {"part-%05d-of-%05d" % (i, num_outputs): "".join(p).encode() for i, p in enumerate(parts)}
    return ("".join(a + "\n\n" for a in evals).encode(),
            "".join(hashlib.md5(a.rstrip().encode()).hexdigest() + "\n" for a in evals).encode(), shards)


@pytest.mark.parametrize("num_test,block", [(7, 0.004), (3, 0.02), (0, 1.0), (12, 0.0001)])
def test_other_counts_block_sizes_and_inputs_follow_the_reference_rules(tmp_path, num_test, block):
    rng = random.Random(num_test)
    wiki = tmp_path / "text"
    wiki.mkdir()
    for i in range(5):
        _wiki_file(wiki / ("wiki_%02d" % i), rng, rng.randint(4, 9), bom=i == 2)
    files = sorted(str(p) for p in wiki.iterdir())
    want_txt, want_md5, want_parts = _reference_rules(files, num_test, block)
    out = tmp_path / "out"
    parts = text_pipeline.run(files, str(out), num_test, block, workers=2, progress=False)
    assert (out / "eval.txt").read_bytes() == want_txt and (out / "eval.md5").read_bytes() == want_md5
    assert {os.path.basename(p): open(p, "rb").read() for p in parts} == want_parts
    if block == 0.0001:  # every file larger than a block: one shard each (the reference crashes here)
        assert len(parts) == 5


def test_too_few_articles_and_bad_input_are_user_errors(wiki_files, tmp_path):
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


def test_rerun_with_another_block_size_leaves_only_the_new_shards(wiki_files, tmp_path):
    d = tmp_path / "rerun"
    shards = {}
    for block in (1.5, 26.92):  # four shards (each ~1 MiB file alone), then one
        parts = text_pipeline.run(wiki_files, str(d), num_test_articles=22, block_size_mb=block,
                                  workers=1, progress=False)
        shards[block] = b"".join(open(p, "rb").read() for p in parts)
    assert sorted(os.listdir(d)) == ["eval.md5", "eval.txt"] + ["part-%05d-of-00500" % i for i in range(len(parts))]
    assert len(parts) == 1
    assert shards[1.5] == shards[26.92]  # the same training text, only cut differently

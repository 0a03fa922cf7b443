import gzip
import hashlib
import io
import glob
import os
import random

import pytest

from mlperf_bert.dataset import text_pipeline
from mlperf_bert.dataset.sentences import sent_tokenize, split_sentences
from mlperf_bert.dataset.wiki_cleanup import clean_line, clean_text
from mlperf_bert.errors import UserError

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
GOLDEN = os.path.join(DATA, "golden", "text")


@pytest.fixture(scope="module")
def wiki_files(tmp_path_factory):
    """The four real WikiExtractor files of tests/data/wiki_sample, decompressed."""
    d = tmp_path_factory.mktemp("wiki_sample")
    paths = []
    for i in range(4):
        path = d / ("wiki_%02d" % i)
        with gzip.open(os.path.join(DATA, "wiki_sample", "wiki_%02d.gz" % i), "rb") as f:
            path.write_bytes(f.read())
        paths.append(str(path))
    return paths


def listing(d):
    """The files of output directory ``d``, less text-pipeline's record of them (which must list them)."""
    names = sorted(os.listdir(d))
    names.remove(text_pipeline.RECORD_NAME)
    assert sorted(text_pipeline.read_record(str(d))) == names
    return names


def md5_file(path):
    with open(path, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


def test_sample_gives_the_reference_outputs_byte_for_byte(wiki_files, tmp_path):
    # MD5SUMS: the reference scripts' outputs on this sample, 22 test articles, 26.92 MiB blocks.
    out = tmp_path / "out"
    wiki_glob = os.path.join(os.path.dirname(wiki_files[0]), "wiki_*")
    assert text_pipeline.main(["text-pipeline", "--wiki_glob=%s" % wiki_glob,
                               "--output_dir=%s" % out, "--num_test_articles=22", "--block_size_mb=26.92",
                               "--workers=2"]) == 0
    with open(os.path.join(GOLDEN, "MD5SUMS")) as f:
        want = dict(reversed(line.split()) for line in f)
    assert listing(out) == sorted(want)
    assert {name: md5_file(out / name) for name in want} == want
    with open(os.path.join(GOLDEN, "eval.md5"), "rb") as f:
        assert (out / "eval.md5").read_bytes() == f.read()


# --- an independent, serial transcription of the reference's five scripts -----------------
# It shares only the per-line rules with the product (clean.sh's substitutions and Punkt,
# which the sample's md5s and the tests below check); the file handling (universal newlines,
# blank lines, separation, utf-8-sig, raw-size blocks) is written here again, the scripts' way.

def reference_outputs(paths, num_test, block_mb, seed=12345):
    stage3 = []
    for path in paths:
        kept, skip = [], False
        with io.open(path, "r", encoding="utf-8") as f:  # cleanup_file.py
            for line in f:
                if skip:
                    skip = False
                elif "<doc" in line:
                    skip = True
                    kept.append("\n")
                elif "</doc>" not in line and len(line) != 1:
                    kept.append(line)
        cleaned = []  # clean.sh
        for line in kept:
            line = clean_line(line[:-1] if line.endswith("\n") else line)
            if line is not None:
                cleaned.append(line + "\n")
        segmented = []  # do_sentence_segmentation.py
        for line in io.StringIO("".join(cleaned), newline=None):
            if len(line) == 1:
                segmented.append("\n")
            segmented.extend(s.strip() + "\n" for s in sent_tokenize(line))
        segmented.append("\n")
        stage3.append("".join(segmented))
    outputs, evals, trains = {}, [], []
    for k, text in enumerate(stage3):  # seperate_test_set.py
        articles = text.split("\n\n")
        count = int((k + 1) * num_test * 1.0 / len(paths)) - int(k * num_test * 1.0 / len(paths))
        rng, ids = random.Random(seed + k * 13), []
        while len(ids) < count:
            i = int(rng.random() * len(articles))
            if i not in ids:
                ids.append(i)
        evals += [a for i, a in enumerate(articles) if i in ids]
        trains.append("".join(a + "\n\n" for i, a in enumerate(articles) if i not in ids))
    outputs["eval.txt"] = "".join(a + "\n\n" for a in evals)
    outputs["eval.md5"] = "".join(hashlib.md5(a.rstrip().encode("utf-8")).hexdigest() + "\n" for a in evals)
    shard, total = -1, 0
    for path, train in zip(paths, trains):  # do_gather.py, one worker
        size = os.path.getsize(path)
        if shard < 0 or block_mb * 1024 * 1024 < total + size:
            shard, total = shard + 1, 0
        content = io.TextIOWrapper(io.BytesIO(train.encode("utf-8")), encoding="utf-8-sig").read()
        if len(content) > 1 and content[-1] == content[-2] == "\n":
            content = content[:-1]
        name = "part-%05d-of-00500" % shard
        outputs[name] = outputs.get(name, "") + content
        total += size
    return {name: text.encode("utf-8") for name, text in outputs.items()}


EDGE_LINES = [
    "A line with a carriage return\rin the middle.",
    "Ends a paragraph</doc> and goes on after it.",
    "Hides a </alt=doc> end tag that clean.sh makes.",
    "   \t",  # white space only: gone after segmentation
    "x",
    "\ufeffStarts with a byte-order mark. It stays.",
    "He was born in St. Imier. The U.S. Congress met. He said \"Stop.\" This ended it.",
    "See [[Category:Things]] here.",
    "A [[link]], a [[target|label]], [[File:a.jpg|thumb|alt=b]], <ref name=\"r\">cite</ref> and <math>x</math>.",
    "a stray <doc line inside an article",
    "Selznick was the Big Producer.\u00a0... Producer was king.",
]


def make_wiki_files(real_files, out_dir, num_files, seed):
    """WikiExtractor-format files: articles of the real sample, mixed with the edge cases above."""
    rng = random.Random(seed)
    paragraphs = []
    for path in real_files:
        with open(path, encoding="utf-8") as f:
            paragraphs += [line.rstrip("\n") for line in f if line.strip() and not line.startswith("<")]
    os.makedirs(out_dir)
    paths = []
    for k in range(num_files):
        parts = ["\ufeffText before the first article. It has no doc line.\n"] if k == 1 else []
        for a in range(rng.randint(3, 12)):
            parts.append('<doc id="%d" url="https://en.wikipedia.org/wiki?curid=%d" title="T%d">\nT%d\n\n'
                         % (a, a, a, a))
            for _ in range(rng.randint(0, 8)):
                line = rng.choice(EDGE_LINES) if rng.random() < 0.3 else rng.choice(paragraphs)
                parts.append(line + rng.choice(["\n", "\n", "\n", "\r\n", "\r"]))
            parts.append("\n" if rng.random() < 0.5 else "")
            parts.append("</doc>\n")
        if k == num_files - 1:
            parts.append("A last line without a newline.")
        path = os.path.join(out_dir, "wiki_%02d" % k)
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write("".join(parts))
        paths.append(path)
    return paths


@pytest.mark.parametrize("num_files,num_test,block_mb", [(5, 7, 0.02), (3, 0, 1.0), (6, 13, 0.001)])
def test_other_inputs_counts_and_blocks_give_what_the_reference_steps_give(wiki_files, tmp_path, num_files,
                                                                          num_test, block_mb):
    paths = make_wiki_files(wiki_files, str(tmp_path / "in"), num_files, seed=num_files * 100 + num_test)
    out = tmp_path / "out"
    parts = text_pipeline.run(paths, str(out), num_test_articles=num_test, block_size_mb=block_mb, workers=2,
                              progress=False)
    want = reference_outputs(paths, num_test, block_mb)
    assert listing(out) == sorted(want)
    for name, data in want.items():
        assert (out / name).read_bytes() == data, name
    assert [os.path.basename(p) for p in parts] == sorted(n for n in want if n.startswith("part-"))
    assert len(want["eval.md5"].splitlines()) == num_test
    if block_mb == 0.001:  # every file is larger than a block: one shard each (the reference crashes)
        assert len(parts) == num_files


def test_punkt_splits_as_nltk_3_4_5():
    # Expected values: NLTK 3.4.5's sent_tokenize with its English model.
    cases = {
        "He was born in St. Imier in 1900.\n": ["He was born in St. Imier in 1900."],
        "The U.S. Congress passed it.\n": ["The U.S. Congress passed it."],
        "Maj. Gen. Smith arrived.\n": ["Maj. Gen. Smith arrived."],
        "In Baker v. Carr the court ruled.\n": ["In Baker v. Carr the court ruled."],
        "It ended.. Then more.\n": ["It ended.. Then more."],
        'He said "Stop." This ended it.\n': ['He said "Stop."', "This ended it."],
        "It ended (as planned.) In May it began.\n": ["It ended (as planned.)", "In May it began."],
        "Some, e.g. within cities, grew.\n": ["Some, e.g.", "within cities, grew."],
        "Apples, pears, etc.), and more.\n": ["Apples, pears, etc.", "), and more."],
        "J. S. Bach wrote it. He died.\n": ["J. S. Bach wrote it.", "He died."],
        "Very bad acting!!! I promise.\n": ["Very bad acting!!!", "I promise."],
        # U+00A0 ends the word before a period, as \s does (later NLTK releases differ here)
        'Hitchcock said: "Selznick was the Big Producer.\u00a0... Producer was king.\n':
            ['Hitchcock said: "Selznick was the Big Producer.', "... Producer was king."],
        # curly quotes are word characters in 3.4.5 (later releases split here)
        "He said \u201cGo.\u201d Then he left.\n": ["He said \u201cGo.\u201d Then he left."],
        "No end here\n": ["No end here"],
        "   \n": [],
    }
    for text, want in cases.items():
        assert split_sentences(text) == want, text
    assert sent_tokenize("One.  Two. ") == ["One.", "Two."]


def test_clean_sh_rules():
    # Expected values: the reference's clean.sh (GNU grep and sed) on these lines.
    cases = {
        "See [[Category:Foo]] here.": None,
        "A [[link]] and [[target|shown]] and [[a|b|c]].": "A link and shown and .",
        "Pic [[File:x.jpg|thumb|alt=Alt text]] end.": "Pic  end.",
        "Pic [[:file:x.jpg]] [[Media:m.ogg]] [[image:i.png]] end.": "Pic :file:x.jpg Media:m.ogg image:i.png end.",
        "One [x] two [[a[b]]] three [[a]b]].": "One x two  three [ab]].",
        "Math <math>x^2</math> and <chem>H2O</chem> and <ins>new</ins>.": "Math x^2 and >H2O and >new.",
        'Ref<ref name="a">cite</ref> and<ref name="b"/> and <, ref x</ref>.': "Ref and and .",
        'Sec <section begin="a"/> <meta a/> <hr/> <hr\\ x/> done.': "Sec  <hr\\ x/> done.",
        'Map <mapframe a="1"/> <mapframe b>x</mapframe> end.': "Map  x end.",
        'Tags <sup>1</sup><br><BR><Br></br><del>d</del><nowiki>n</nowiki><small>s</small><poem>p</poem>'
        '<poem style="x">q end.': "Tags 1dnspq end.",
        'Div <div class="a">x</div><div>y</div style></div x> <gallery mode="x">g</gallery> <graph>{g}</graph>'
        '</references>': "Div xy g ",
        "Weird </d[[File:q]]oc> and al[[x]]t= alt=x.": "Weird </dFile:qoc> and alxt= x.",
        "Http <http://x.y> <Ref name=q> <includeonly>i</includeonly> <graph a>g</graph>.": "Http    .",
        "A </alt=doc> B": "A \r B",
    }
    for line, want in cases.items():
        assert clean_line(line) == want, line


def test_cleanup_keeps_one_blank_line_per_article_and_universal_newlines():
    text = ('\ufeff<doc id="1">\nTitle\n\nFirst.\r\nSecond.\rThird.\n  \n</doc>\n'
            '<doc id="2">\n<doc title line>\n</doc>\nlast')
    assert clean_text(text) == "\nFirst.\nSecond.\nThird.\n  \n\nlast\n"


def test_gather_plan_counts_raw_sizes_and_never_makes_an_empty_shard():
    assert text_pipeline.gather_plan([5, 5, 5], 10) == [[0, 1], [2]]
    assert text_pipeline.gather_plan([5, 5, 5], 9.9) == [[0], [1], [2]]
    assert text_pipeline.gather_plan([20, 1], 10) == [[0], [1]]
    assert text_pipeline.gather_piece("\ufeffa\n\n") == "a\n"
    assert text_pipeline.gather_piece("a\n") == "a\n"
    assert text_pipeline.gather_piece("") == ""


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


def test_a_file_whose_pieces_all_go_to_eval_is_a_user_error(tmp_path):
    """Two articles and the blank piece after them: 2 eval articles work, 3 take every piece and
    the reference's do_gather.py crashes (IndexError) on the empty training text. The md5s are
    the real reference's (NLTK 3.4.5): process_wiki.sh's steps on this file with
    ``seperate_test_set.py --num_test_articles=2`` and ``do_gather.py --block_size=26.92``."""
    wiki = tmp_path / "wiki_00"
    wiki.write_text("".join('<doc id="%d">\nT\n\nArticle %d is here. It has two sentences.\n</doc>\n' % (i, i)
                            for i in range(2)))
    out = tmp_path / "out"
    text_pipeline.run([str(wiki)], str(out), num_test_articles=2, workers=1, progress=False)
    assert {n: md5_file(out / n) for n in listing(out)} == {
        "eval.md5": "13ddf35f627b96e181b17f2e725a005e", "eval.txt": "f2a50d93a7a59eb0c0ec8ed8553348be",
        "part-00000-of-00500": "68b329da9893e34099c7d8ad5cb9c940"}
    with pytest.raises(UserError, match="wiki_00 has 2 articles but must give 3 eval articles: give more"):
        text_pipeline.run([str(wiki)], str(tmp_path / "out3"), num_test_articles=3, workers=1, progress=False)


def test_a_nul_character_is_a_user_error(tmp_path):
    """clean.sh's grep takes a file with a NUL for binary: grep 3.8 (run on this input) wrote
    nothing of it, older greps a 'Binary file matches' line; the text passed through silently."""
    wiki = tmp_path / "wiki_00"
    wiki.write_bytes(b'<doc id="1">\nT\nA nul\x00here. And more.\n</doc>\n')
    with pytest.raises(UserError, match=r"wiki_00 line 3 holds a NUL character, .* remove it"):
        text_pipeline.run([str(wiki)], str(tmp_path / "out"), num_test_articles=0, workers=1, progress=False)


def test_a_file_with_no_doc_line_is_refused_not_taken_for_articles(wiki_files, tmp_path):
    """A hostile sweep: the XML dump itself (wikiextractor not run), or notes a wide glob matched
    beside the wiki_nn files, went through the clean-up as text: its lines in the shards and the
    eval set, exit 0. A file that holds no <doc line is not WikiExtractor output: refused, named."""
    notes = tmp_path / "in" / "notes"
    notes.parent.mkdir()
    notes.write_text("<mediawiki>\n  <page>\n    <title>A</title>\n  </page>\n\nSome notes. More of them.\n")
    out = tmp_path / "out"
    with pytest.raises(UserError) as e:
        text_pipeline.run(wiki_files[:1] + [str(notes)], str(out), num_test_articles=0, workers=1, progress=False)
    assert str(e.value) == (
        "%s holds no <doc ...> line, so it is not WikiExtractor output (the XML dump itself? run wikiextractor on it "
        "first, docs/dataset.md section 3): narrow --wiki_glob to the WikiExtractor files, e.g. 'text/*/wiki_??'"
        % notes)
    assert not any(n.startswith("part-") for n in (os.listdir(out) if out.exists() else []))


def test_rerun_with_another_block_size_leaves_only_the_new_shards(wiki_files, tmp_path):
    d = tmp_path / "rerun"
    runs = []
    for block in (0.5, 2.0):
        parts = text_pipeline.run(wiki_files, str(d), num_test_articles=22, block_size_mb=block,
                                  workers=2, progress=False)
        runs.append(b"".join(open(p, "rb").read() for p in parts))
        assert listing(d) == ["eval.md5", "eval.txt"] + sorted(os.path.basename(p) for p in parts)
    assert len(parts) == 2  # four 0.98 MiB files, two to a 2 MiB block; the 0.5 MiB run made four
    assert runs[0] == runs[1]  # the same training text, in other shards


def test_files_it_did_not_write_are_never_removed_or_overwritten(wiki_files, tmp_path):
    """Issue 23: run into a folder of downloaded official shards, text-pipeline removed their
    part-*-of-* files ("from an earlier run with another shard count")."""
    d = tmp_path / "results4"
    d.mkdir()
    official = {"part-00000-of-00500": b"official shard 0\n", "part-00499-of-00500": b"official shard 499\n",
                "eval.txt": b"official eval\n"}
    for name, data in official.items():
        (d / name).write_bytes(data)
    argv = ["text-pipeline", "--wiki_glob=%s" % os.path.join(os.path.dirname(wiki_files[0]), "wiki_*"),
            "--output_dir=%s" % d, "--num_test_articles=22", "--workers=1"]
    with pytest.raises(UserError, match=r"--output_dir .*results4 holds 3 file\(s\) text-pipeline did not write "
                                        r"\(eval.txt, part-00000-of-00500, part-00499-of-00500\): give an empty"):
        text_pipeline.main(argv)
    assert sorted(os.listdir(d)) == sorted(official)
    assert all((d / n).read_bytes() == data for n, data in official.items())
    # its own earlier outputs it replaces; a foreign shard that appears beside them stops it again
    own = tmp_path / "own"
    text_pipeline.run(wiki_files, str(own), num_test_articles=22, block_size_mb=0.5, workers=1, progress=False)
    (own / "part-00007-of-00500").write_bytes(b"someone else's\n")
    with pytest.raises(UserError, match=r"holds 1 file\(s\) text-pipeline did not write \(part-00007-of-00500\)"):
        text_pipeline.run(wiki_files, str(own), num_test_articles=22, block_size_mb=2.0, workers=1, progress=False)
    assert (own / "part-00007-of-00500").read_bytes() == b"someone else's\n"
    assert len([n for n in os.listdir(own) if n.startswith("part-")]) == 5


def test_the_count_it_says_fits_fits_every_file(wiki_files, tmp_path):
    """A review: the line gave the count that fits the first short file, "(151 fits this file)" of the
    sample's wiki_00, and the rerun with it was refused on wiki_03 ("must give 38", "(128 fits this file)").
    It now says the count every file fits, which the rerun takes, and how many other files are short."""
    with pytest.raises(UserError) as e:
        text_pipeline.run(wiki_files, str(tmp_path / "a"), workers=2, progress=False)
    assert str(e.value) == ("%s has 37 articles but must give 2500 eval articles: give more input files or a smaller "
                            "--num_test_articles (3 other files too; 128 fits every file)" % wiki_files[0])
    text_pipeline.run(wiki_files, str(tmp_path / "b"), num_test_articles=128, workers=1, progress=False)
    assert len(open(tmp_path / "b" / "eval.md5").read().split()) == 128
    with pytest.raises(UserError, match=r"wiki_03 has 32 articles but must give 33 eval articles: .* \(128 fits "
                                        r"every file\)\Z"):
        text_pipeline.run(wiki_files, str(tmp_path / "c"), num_test_articles=129, workers=1, progress=False)


def test_the_largest_count_is_every_files_though_shares_are_not_monotonic():
    """Four files of one article each: 4 gives each 1; 5, 6 and 7 give one of them 2, which it cannot."""
    assert [text_pipeline.largest_fitting([2, 2, 2, 2], t) for t in (4, 5, 8, 9)] == [3, 4, 4, 4]
    assert text_pipeline.largest_fitting([1, 40], 10) == 1  # a file with none: only a count giving it no share


def test_articles_are_counted_as_they_are_and_noprogress_is_quiet(tmp_path):
    """Issue 33: an empty file 'has 1 articles' (the piece after the last blank line was counted);
    there was no --noprogress. A new user's journey: the line gave no count that fits (only the docs
    said one for the sample); where one does, it says the largest."""
    import subprocess
    import sys
    empty, one = tmp_path / "wiki_00", tmp_path / "wiki_01"
    empty.write_bytes(b"")
    one.write_text('<doc id="1" url="u" title="T">\nT\n\nOne sentence. And a second one.\n</doc>\n')
    for path, count, fits in ((empty, "0 articles", ""), (one, "1 article", " (1 fits every file)")):
        proc = subprocess.run([sys.executable, "-m", "mlperf_bert", "text-pipeline", "--wiki_glob=%s" % path,
                               "--output_dir=%s" % (tmp_path / "out"), "--workers=1", "--noprogress"],
                              capture_output=True, text=True)
        assert proc.returncode == 2 and not proc.stdout
        assert proc.stderr == ("error: %s has %s but must give 10000 eval articles: give more input files or a "
                               "smaller --num_test_articles%s\n" % (path, count, fits))


def test_its_record_never_names_a_file_outside_its_folder(wiki_files, tmp_path):
    """A hostile sweep: ``.text_pipeline.json`` naming ``../victim`` and an absolute path, and a
    rerun removed both ("removed ... written by an earlier run"), exit 0; ``{"outputs": ["eval.txt",
    1]}`` ended in a TypeError traceback. A name that is not one of its own outputs in this folder
    is refused before anything is written, naming the record; nothing is removed."""
    import json
    import subprocess
    import sys
    own = tmp_path / "tp"
    text_pipeline.run(wiki_files, str(own), num_test_articles=22, block_size_mb=0.5, workers=1, progress=False)
    before = {n: (own / n).read_bytes() for n in os.listdir(own)}
    victims = [tmp_path / "victim_rel.txt", tmp_path / "victim_abs.txt"]
    for v in victims:
        v.write_text("not text-pipeline's\n")
    record = own / text_pipeline.RECORD_NAME
    names = json.loads(record.read_text())["outputs"]
    argv = ["text-pipeline", "--wiki_glob=%s" % os.path.join(os.path.dirname(wiki_files[0]), "wiki_*"),
            "--output_dir=%s" % own, "--num_test_articles=22", "--workers=1"]
    for bad in ("../victim_rel.txt", str(victims[1]), 1, "part-x/../../victim_rel.txt-of-y"):
        record.write_text(json.dumps({"outputs": names + [bad]}))
        why = "%s names %r, not a file text-pipeline writes in %s: give an empty --output_dir (nothing it names is " \
              "removed)" % (record, bad, own)
        if bad == 1:  # the command as a user runs it, once
            proc = subprocess.run([sys.executable, "-m", "mlperf_bert"] + argv, capture_output=True, text=True)
            assert (proc.returncode, proc.stderr) == (2, "error: %s\n" % why), proc.stdout + proc.stderr
        else:
            with pytest.raises(UserError) as e:
                text_pipeline.main(argv)
            assert str(e.value) == why
        assert all(v.exists() for v in victims)
        assert {n: (own / n).read_bytes() for n in os.listdir(own) if n != text_pipeline.RECORD_NAME} == {
            n: data for n, data in before.items() if n != text_pipeline.RECORD_NAME}


KILLED_MIDWAY = """
import os, shutil, signal, sys
from mlperf_bert.cli import run_main
from mlperf_bert.dataset import text_pipeline
copy, shards = shutil.copyfileobj, []


def copy_then_die(fin, fout, *args):  # kill -9 while the second shard is half written
    shards.append(fin.name)
    if len(shards) == 2:
        fout.write(fin.read(1000))
        fout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    copy(fin, fout, *args)


shutil.copyfileobj = copy_then_die
run_main(text_pipeline.main, sys.argv)
"""


def test_make_dataset_refuses_the_shards_of_a_text_pipeline_run_that_did_not_finish(wiki_files, tmp_path):
    """A hostile sweep: text-pipeline killed after its first shards left eval.txt and part-00000 beside a
    record listing more, and make-dataset took them as the whole text (exit 0, a training set of a
    fraction of it); the rerun meant to finish it refused the killed run's part-00001-of-00500.tmp-PID
    as a file it did not write."""
    import json
    import subprocess
    import sys
    from mlperf_bert.dataset import make_dataset
    tk = tmp_path / "tk"
    argv = ["text-pipeline", "--wiki_glob=%s" % os.path.join(os.path.dirname(wiki_files[0]), "wiki_0[01]"),
            "--output_dir=%s" % tk, "--num_test_articles=22", "--block_size_mb=0.5", "--workers=1", "--noprogress"]
    proc = subprocess.run([sys.executable, "-c", KILLED_MIDWAY] + argv[1:], cwd=os.path.dirname(DATA),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    left = os.listdir(tk)
    assert "part-00000-of-00500" in left and any(n.startswith("part-00001-of-00500.tmp-") for n in left), left
    fix = "rerun text-pipeline with the same flags to finish it"
    mk = ["make-dataset", "--text_dir=%s" % tk, "--output_dir=%s" % (tmp_path / "ds"),
          "--vocab_file=%s" % os.path.join(DATA, "vocab.txt"), "--max_seq_length=128", "--max_predictions_per_seq=20",
          "--dupe_factor=1", "--num_eval_examples=5", "--workers=1", "--noprogress"]
    with pytest.raises(UserError) as e:
        make_dataset.main(mk)
    assert str(e.value) == ("--text_dir %s holds an unfinished text-pipeline run: 1 of the 4 files its record "
                            ".text_pipeline.json lists are missing (part-00001-of-00500): %s" % (tk, fix))
    assert not (tmp_path / "ds").exists()
    # verify said of the folder (or its files) what it said of any text shards, the unfinished run unsaid
    from mlperf_bert.dataset import checksums
    for given in ([str(tk)], [str(tk / "part-00000-of-00500")]):
        lines = []
        assert not checksums.verify(given, out=lines.append)
        assert "MISMATCH %s (holds an unfinished text-pipeline run: 1 of the 4 files its record .text_pipeline.json " \
               "lists are missing (part-00001-of-00500): %s)" % (tk, fix) in lines, lines
    assert text_pipeline.main(argv) == 0  # the same flags finish it
    lines = []
    checksums.verify([str(tk)], out=lines.append)
    assert not [line for line in lines if "unfinished" in line], lines
    assert listing(tk) == ["eval.md5", "eval.txt", "part-00000-of-00500", "part-00001-of-00500"]
    assert len(make_dataset.find_text_shards(str(tk))[0]) == 2
    # a rerun stopped before its first output changed nothing: the finished set stays usable
    with pytest.raises(UserError, match="must give 5000 eval articles"):
        text_pipeline.main([a for a in argv if not a.startswith("--num_test")])
    assert len(make_dataset.find_text_shards(str(tk))[0]) == 2
    record = tk / text_pipeline.RECORD_NAME
    names = json.loads(record.read_text())["outputs"]
    record.write_text(json.dumps({"outputs": names, "finished": False}))  # killed with every file written
    with pytest.raises(UserError, match=r"holds an unfinished text-pipeline run: its record .text_pipeline.json says "
                                        r"its last run did not finish \(its files may mix two runs\): " + fix):
        make_dataset.find_text_shards(str(tk))
    record.write_text(json.dumps({"outputs": names, "finished": True}))
    shard = (tk / "part-00001-of-00500").read_bytes()
    (tk / "part-00001-of-00500").unlink()  # lost since the run finished: the rest is not the whole text
    with pytest.raises(UserError, match=r"1 of the 4 files its record .text_pipeline.json lists are missing "
                                        r"\(part-00001-of-00500\)"):
        make_dataset.find_text_shards(str(tk))
    (tk / "part-00001-of-00500").write_bytes(shard)
    # an older version's record (no "finished"): its run finished if its work folder went with it
    record.write_text(json.dumps({"outputs": names}))
    assert len(make_dataset.find_text_shards(str(tk))[0]) == 2
    (tk / text_pipeline.WORK_NAME).mkdir()
    with pytest.raises(UserError, match="holds an unfinished text-pipeline run"):
        make_dataset.find_text_shards(str(tk))


@pytest.mark.parametrize("value, shown", [("nan", "nan"), ("inf", "inf"), ("-inf", "-inf"), ("0", "0.0"),
                                          ("-1", "-1.0")])
def test_a_block_size_that_is_not_a_finite_positive_number_is_refused(tmp_path, value, shown):
    """--block_size_mb=nan (and inf) passed the `<= 0` check and ran."""
    wiki = tmp_path / "wiki_00"
    wiki.write_text('<doc id="1" url="u" title="T">\nT\n\nOne sentence. And a second one.\n</doc>\n')
    out = tmp_path / "out"
    with pytest.raises(UserError) as e:
        text_pipeline.main(["text-pipeline", "--wiki_glob=%s" % wiki, "--output_dir=%s" % out,
                            "--num_test_articles=0", "--workers=1", "--noprogress", "--block_size_mb=" + value])
    assert str(e.value) == "--block_size_mb=%s: give a finite shard size in MiB > 0 (the reference's: 26.92)" % shown
    assert not out.exists()


@pytest.mark.parametrize("workers", ["0", "-2"])
def test_workers_below_one_are_refused_as_every_commands(tmp_path, workers):
    """A hostile sweep: text-pipeline ran with --workers=0 or -2 (as all cores, or one), which
    make-dataset and verify refuse: the one check of flags.parse is every --workers' now."""
    wiki = tmp_path / "wiki_00"
    wiki.write_text('<doc id="1" url="u" title="T">\nT\n\nOne sentence. And a second one.\n</doc>\n')
    out = tmp_path / "out"
    with pytest.raises(UserError) as e:
        text_pipeline.main(["text-pipeline", "--wiki_glob=%s" % wiki, "--output_dir=%s" % out,
                            "--num_test_articles=0", "--noprogress", "--workers=" + workers])
    assert str(e.value) == "--workers=%s must be at least 1" % workers
    assert not out.exists()


def test_a_link_to_a_missing_wiki_file_is_refused_not_skipped(wiki_files, tmp_path):
    """A glob's link to a file that is gone was dropped with the folders it skips: exit 0, shards
    without that file's articles and the eval articles drawn from the others."""
    wiki = tmp_path / "wiki"
    wiki.mkdir()
    os.symlink(wiki_files[0], str(wiki / "wiki_00"))
    os.symlink(str(tmp_path / "gone"), str(wiki / "wiki_01"))
    out = tmp_path / "out"
    with pytest.raises(UserError) as e:
        text_pipeline.main(["text-pipeline", "--wiki_glob=%s" % (wiki / "wiki_*"), "--output_dir=%s" % out,
                            "--num_test_articles=2", "--workers=1", "--noprogress"])
    assert str(e.value) == ("--wiki_glob=%s matches %s, a link to a file that does not exist: restore the file, or "
                            "remove the link" % (wiki / "wiki_*", wiki / "wiki_01"))
    assert not out.exists()
    # another sweep: a named pipe or a folder among the matches was skipped too (exit 0, the shards and
    # the eval draw of the other files); the reference opens every match
    os.remove(wiki / "wiki_01")
    for make, kind in ((os.mkfifo, "a named pipe (FIFO)"), (os.mkdir, "a directory")):
        make(str(wiki / "wiki_01"))
        with pytest.raises(UserError) as e:
            text_pipeline.main(["text-pipeline", "--wiki_glob=%s" % (wiki / "wiki_*"), "--output_dir=%s" % out,
                                "--num_test_articles=2", "--workers=1", "--noprogress"])
        assert str(e.value) == ("--wiki_glob=%s matches %s, %s, not a file: narrow the glob to the WikiExtractor "
                                "files, e.g. 'text/*/wiki_??'" % (wiki / "wiki_*", wiki / "wiki_01", kind))
        assert not out.exists()
        os.rmdir(wiki / "wiki_01") if kind == "a directory" else os.remove(wiki / "wiki_01")


def test_an_output_dir_that_is_a_file_says_the_fix(wiki_files, tmp_path):
    """A hostile sweep: text-pipeline --output_dir=FILE said "cannot create output directory FILE:
    File exists" and no fix (its lock made the folder, with a message of its own); one message now."""
    afile = tmp_path / "afile"
    afile.write_text("x\n")
    with pytest.raises(UserError) as e:
        text_pipeline.main(["text-pipeline", "--wiki_glob=%s" % wiki_files[0], "--output_dir=%s" % afile,
                            "--num_test_articles=1", "--noprogress"])
    assert str(e.value) == ("cannot create output directory %s: File exists: a file stands where a directory is "
                            "expected: give another path, or move the file away" % afile)


def test_an_input_refused_once_read_leaves_no_output_dir_it_made(wiki_files, tmp_path):
    """A file that is not UTF-8, one with a NUL and a text of too few articles are refused only once
    a worker read them, and the run left the --output_dir (and its parents) its lock had made,
    empty, for the user's next look to take for a started output. They go again; a folder the
    user had stays, as it was."""
    import shutil
    import subprocess
    import sys
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "wiki_latin1").write_bytes('<doc id="1">\nTitle\nCaf\xe9 au lait.\n</doc>\n'.encode("latin-1"))
    (inputs / "wiki_nul").write_bytes(b'<doc id="1">\nT\nA nul\x00here. And more.\n</doc>\n')
    shutil.copy(wiki_files[0], str(inputs / "wiki_00"))
    out = tmp_path / "new" / "text"
    for name, flags, why in (("wiki_latin1", ["--num_test_articles=0"], "wiki_latin1 is not UTF-8 text"),
                             ("wiki_nul", ["--num_test_articles=0"], "wiki_nul line 3 holds a NUL character"),
                             ("wiki_00", [], "wiki_00 has 37 articles but must give 10000 eval articles")):
        argv = ["text-pipeline", "--wiki_glob=%s" % (inputs / name), "--output_dir=%s" % out, "--workers=1",
                "--noprogress"] + flags
        with pytest.raises(UserError, match=why):
            text_pipeline.main(argv)
        assert not (tmp_path / "new").exists(), name
    had = tmp_path / "had"
    had.mkdir()
    with pytest.raises(UserError, match="wiki_00 has 37 articles"):
        text_pipeline.main(["text-pipeline", "--wiki_glob=%s" % (inputs / "wiki_00"), "--output_dir=%s" % had,
                            "--workers=2", "--noprogress"])
    assert had.is_dir() and os.listdir(had) == []
    # as a user runs it: one line naming the file, exit 2, nothing made
    proc = subprocess.run([sys.executable, "-m", "mlperf_bert", "text-pipeline", "--wiki_glob=%s" % (inputs / "wiki_n*"),
                           "--output_dir=%s" % out, "--workers=2", "--noprogress", "--num_test_articles=0"],
                          cwd=os.path.dirname(DATA), capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (2, "") and proc.stderr.startswith("error: %s line 3 holds a NUL" % (
        inputs / "wiki_nul")) and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "new").exists()


def test_a_shard_given_as_input_is_refused_as_such_in_a_folder_named_with_glob_characters(tmp_path):
    """A review: --output_dir's shards were found by a glob of its name unescaped, so in "o [1]" a shard
    also given as input was not seen as one (the refusal came, later, as a file text-pipeline did not write)."""
    out = tmp_path / "o [1]"
    out.mkdir()
    shard = out / "part-00000-of-00500"
    shard.write_text('<doc id="1" url="u" title="T">\nT\n\nOne sentence. And a second one.\n</doc>\n')
    with pytest.raises(UserError) as e:
        text_pipeline.main(["text-pipeline", "--wiki_glob=%s" % glob.escape(str(shard)), "--output_dir=%s" % out,
                            "--num_test_articles=0", "--workers=1", "--noprogress"])
    assert str(e.value) == ("output %s is the input %s: writing it would destroy the input; give another output path"
                            % (shard, shard))


def test_verify_of_a_samples_text_folder_lists_only_what_its_run_made(tmp_path, wiki_files):
    """The wiki sample makes one shard, named -of-00500 as every text-pipeline shard: verify of its folder
    named the 499 others MISSING and its record UNKNOWN; now its record says the set (MISMATCH against
    results/ stays: it is not the reference's text), and a shard the record lists that is gone is MISSING."""
    from mlperf_bert.dataset import checksums
    out = tmp_path / "results4"
    glob = os.path.join(os.path.dirname(wiki_files[0]), "wiki_??")
    assert text_pipeline.main(["text-pipeline", "--wiki_glob=%s" % glob, "--output_dir=%s" % out,
                               "--num_test_articles=22", "--noprogress"]) == 0
    assert listing(out) == ["eval.md5", "eval.txt", "part-00000-of-00500"]
    lines = []
    assert not checksums.verify([str(out)], out=lines.append)
    assert lines[-1] == "verify: 1 OK, 3 MISMATCH, 0 MISSING, 0 UNKNOWN: FAILED", lines
    assert not [line for line in lines if "MISSING" in line.split()[0] or text_pipeline.RECORD_NAME in line], lines
    (out / "part-00000-of-00500").unlink()
    lines = []
    assert not checksums.verify([str(out)], out=lines.append)
    assert [line for line in lines if line.startswith("MISSING")] == ["MISSING %s" % (out / "part-00000-of-00500")]

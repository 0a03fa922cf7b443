"""The fast tokenizers (Python memo, C whole-file) give the reference tokenizer's ids on any Unicode text."""
import random

import pytest

from mlperf_bert.errors import UserError
from mlperf_bert.dataset import tokenization
from mlperf_bert.dataset.pretraining_data import read_documents
from mlperf_bert.dataset.tokenization import BasicTokenizer, FastTokenizer, FullTokenizer, load_vocab

# Code points that exercise every branch: ASCII, accents, Greek sigma, combining marks,
# CJK (BMP and astral), control/format chars, Unicode whitespace, punctuation, 0 and U+FFFD.
SPECIAL = ("\x00\x01\x0b\x0c\x1c\x1f\x7f\x85\xa0\xad\u00e9\u00c9\u0301\u0308\u03a3\u03c3\u03c2"
           "\u0130\u1e9e\u2028\u2029\u200b\u200d\u2003\u3000\ufeff\ufffd\u4e2d\u6587\u3400\uf900"
           "\U00020000\U0002f800\u00bf\u00a1\u2014\u201c\u2019\u00b7\u0e01\u0644\u05d0\u0915\u093f"
           "\t\n\r ,.!?'\"-()[]{}#$%&*+/:;<=>@\\^_`|~")


def _random_text(rng, n):
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.45:
            out.append(rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789   "))
        elif r < 0.75:
            out.append(rng.choice(SPECIAL))
        elif r < 0.95:
            out.append(chr(rng.randint(0x80, 0xFFFF)))
        else:
            out.append(chr(rng.randint(0x10000, 0x2FFFF)))
    return "".join(c for c in out if not 0xD800 <= ord(c) <= 0xDFFF)


def _small_vocab():
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "##a", "ab", "##b", "hello", "world",
             "σ", "ς", "##σ", "##ς", "e", "##e", "中", ",", "!", "héllo", "##llo", "he"]
    return {w: i for i, w in enumerate(words)}


def _check_same(vocab, texts, do_lower_case):
    slow = FullTokenizer(vocab=vocab, do_lower_case=do_lower_case)
    fast = FastTokenizer(vocab=vocab, do_lower_case=do_lower_case)
    for text in texts:
        assert fast.ids(text) == slow.convert_tokens_to_ids(slow.tokenize(text)), repr(text)


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_fast_equals_reference_on_random_unicode_small_vocab(do_lower_case):
    rng = random.Random(1)
    _check_same(_small_vocab(), [_random_text(rng, rng.randint(0, 80)) for _ in range(1500)], do_lower_case)


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_fast_equals_reference_on_random_unicode_real_vocab(vocab_file, do_lower_case):
    rng = random.Random(2)
    _check_same(load_vocab(vocab_file), [_random_text(rng, rng.randint(0, 120)) for _ in range(1500)],
                do_lower_case)


def test_fast_equals_reference_on_golden_lines(vocab_file, golden_dir):
    with open(golden_dir + "/input/part-00001-of-00004", encoding="utf-8") as f:
        lines = f.read().split("\n")[:3000]
    _check_same(load_vocab(vocab_file), lines, True)


@pytest.mark.parametrize("text, expected", [
    ("ΟΔΥΣΣΕΥΣ", ["οδυσσευς"]),          # Python's lower(): final sigma at the word's end
    ("ΣΑΣ.", ["σας", "."]),                # the final form depends on the whole whitespace token
    ("Héllo, WORLD!", ["hello", ",", "world", "!"]),
    ("naïve café", ["naive", "cafe"]),
    ("中文abc字", ["中", "文", "abc", "字"]),
    ("\U00020000x", ["\U00020000", "x"]),
    ("a\x00b\ufffdc\x07d", ["abcd"]),       # NUL, U+FFFD, control chars dropped
    ("zero\u200bwidth\u00adhy", ["zerowidthhy"]),  # Cf dropped
    ("x\u00a0y\u3000z\tw", ["x", "y", "z", "w"]),  # Zs and tab are whitespace
    ("x\u2028y", ["x", "y"]),               # not Zs, but str.split() splits on it
    ("don't  re-use", ["don", "'", "t", "re", "-", "use"]),
    ("¿qué? «sí»", ["¿", "que", "?", "«", "si", "»"]),
    ("$5+3=8^2", ["$", "5", "+", "3", "=", "8", "^", "2"]),
])
def test_basic_tokenizer_hand_checked(text, expected):
    assert BasicTokenizer(do_lower_case=True).tokenize(text) == expected


def test_no_lower_case_keeps_case_and_accents():
    assert BasicTokenizer(do_lower_case=False).tokenize("Héllo ΣΑΣ") == ["Héllo", "ΣΑΣ"]


def test_wordpiece_long_words_and_unknowns():
    vocab = _small_vocab()
    fast, slow = FastTokenizer(vocab=vocab), FullTokenizer(vocab=vocab)
    unk, a, aa = vocab["[UNK]"], vocab["a"], vocab["##a"]
    assert fast.ids("a" * 200) == [a] + [aa] * 199          # 200 chars: still split
    assert fast.ids("a" * 201) == [unk]                     # over max_input_chars_per_word
    assert fast.ids("hello abq world") == [vocab["hello"], unk, vocab["world"]]
    # accents are stripped before WordPiece, so "héllo" is "hello"; "hé" cased stays split
    assert fast.ids("abab héllo") == [vocab["ab"], vocab["##a"], vocab["##b"], vocab["hello"]]
    assert slow.tokenize("abab héllo") == ["ab", "##a", "##b", "hello"]
    cased = FastTokenizer(vocab=vocab, do_lower_case=False)
    assert cased.ids("hello héllo") == [vocab["hello"], vocab["héllo"]]


def test_real_vocab_examples(vocab_file):
    tok = FullTokenizer(vocab_file)
    assert tok.tokenize("The UNAFFABLE runner") == ["the", "una", "##ffa", "##ble", "runner"]
    assert FastTokenizer(vocab_file).tokenize("The UNAFFABLE runner") == tok.tokenize("The UNAFFABLE runner")


@pytest.mark.parametrize("content, fix", [
    (None, "cannot read"),
    (b"\xff\xfe\x00a\n", "not UTF-8"),
    (b"hello\nworld\n[CLS]\n[SEP]\n", "lacks [MASK], [UNK]"),
])
def test_bad_vocab_is_one_line_error(tmp_path, content, fix):
    path = tmp_path / "vocab.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UserError, match=fix.replace("[", r"\[").replace("]", r"\]")) as e:
        load_vocab(str(path))
    assert "\n" not in str(e.value) and str(path) in str(e.value)


# ---- the C tokenizer of whole files (_fasttok) gives the Python path's corpus ----

needs_c = pytest.mark.skipif(tokenization._fasttok is None, reason="the C tokenizer is not built")


def _corpora(paths, vocab, do_lower_case):
    out = []
    for fast in (None, False):
        c = read_documents(paths, FastTokenizer(vocab=vocab, do_lower_case=do_lower_case), fast=fast)
        out.append((c.tokens.tolist(), c.seg_off.tolist(), c.doc_seg.tolist()))
    return out


@needs_c
@pytest.mark.parametrize("do_lower_case", [True, False])
def test_c_tokenizer_equals_python_on_random_unicode_files(tmp_path, vocab_file, do_lower_case):
    rng = random.Random(3)
    for vocab in (_small_vocab(), load_vocab(vocab_file)):
        paths = []
        for f in range(3):  # documents go on across files; the second has no final newline
            lines = ["" if r < 0.1 else " \t\x1c\u3000\x85" if r < 0.15 else _random_text(rng, rng.randint(0, 60))
                     for r in (rng.random() for _ in range(300))]
            lines[7] = " ".join(lines[8:200])  # more words than the C tokenizer looks up at once
            paths.append(tmp_path / ("f%d.txt" % f))
            paths[-1].write_bytes(("\n".join(lines) + ("" if f == 1 else "\n")).encode("utf-8"))
        c, py = _corpora([str(p) for p in paths], vocab, do_lower_case)
        assert c == py and len(c[0]) > 5000 and len(c[2]) > 50


@needs_c
def test_c_tokenizer_equals_python_on_every_code_point(tmp_path, vocab_file):
    # planes 0-3 (every assigned character), the tags and samples of the private-use planes
    cps = [cp for cp in list(range(1, 0x32000)) + list(range(0xE0000, 0xE0200)) + list(range(0xF0000, 0x110000, 97))
           if not 0xD800 <= cp <= 0xDFFF and cp != 10]
    text = "\n".join("x" + "".join(map(chr, cps[i:i + 40])) + "Ab, " + chr(cps[i]) for i in range(0, len(cps), 40))
    path = tmp_path / "all.txt"
    path.write_text(text, encoding="utf-8")
    c, py = _corpora([str(path)], load_vocab(vocab_file), True)
    assert c == py


@needs_c
def test_c_tokenizer_refuses_invalid_utf8_where_python_does(tmp_path, vocab_file):
    vocab = load_vocab(vocab_file)
    rng = random.Random(4)
    special = [0x80, 0xbf, 0xc0, 0xc1, 0xc2, 0xdf, 0xe0, 0xed, 0xef, 0xf0, 0xf4, 0xf5, 0xff]
    tok = FastTokenizer(vocab=vocab).corpus_tokenizer()
    for _ in range(3000):
        data = bytes(rng.choice([rng.randint(0, 255), rng.randint(0x80, 0xbf), rng.choice(special)])
                     for _ in range(rng.randint(1, 6)))
        try:
            data.decode("utf-8")
            tok.feed(data)
        except UnicodeDecodeError:
            with pytest.raises(ValueError, match="invalid UTF-8"):
                tok.feed(data)
    # the one-line error names the file and the line, as on the Python path
    for bad in (b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe0\x80\xaf", b"\xc3"):
        path = tmp_path / "bad.txt"
        path.write_bytes(b"fine line\n\nsecond doc\nx " + bad + b" y\nlast\n")
        for fast in (None, False):
            with pytest.raises(UserError, match=r"input file .*bad\.txt is not UTF-8 text \(line 4\): convert"):
                read_documents([str(path)], FastTokenizer(vocab=vocab), fast=fast)

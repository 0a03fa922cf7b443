"""WikiExtractor output -> cleaned text, as the reference's ``cleanup_file.py`` then ``clean.sh``.

cleanup_file.py: a line containing ``<doc`` becomes one blank line and the line after it (the
title) is dropped; lines containing ``</doc>`` and empty lines are dropped; every other line,
white space only included, is kept. clean.sh: drops lines that are a ``<doc ...>`` tag or hold a
category link, then applies its sed substitutions in order, each to every match of a line.
The patterns below are the sed expressions (POSIX basic regular expressions) written for Python.
"""
import re

from mlperf_bert.dataset.sentences import lines

_DROP = (re.compile(r"^<doc [^>]*>$"), re.compile(r"\[\[Category:[^][]*\]\]"))
_SED = [
    (r"\[\[([^]|[]*)\]\]", r"\1"), (r"\[\[([^]|[]*)\]\]", r"\1"),
    (r"\[\[[^]|[]*\|([^]|[]*)\]\]", r"\1"), (r"\[\[[^]|[]*\|([^]|[]*)\]\]", r"\1"),
    (r"\[\[:*[Ff]ile:[^][]*\]\]", ""), (r"\[\[[Mm]edia:[^][]*\]\]", ""), (r"\[\[[Ii]mage:[^][]*\]\]", ""),
    (r"\[([^]|[]*)\]", r"\1"), (r"\[\[([^][]*)\]\]", ""), (r"alt=", ""), (r"</doc>", "\r"),
    (r"<chem([^<]*)</chem>", r"\1"), (r"<ins([^<]*)</ins>", r"\1"), (r"<, ref ([^<]*)</ref>", ""),
    (r"<includeonly([^<]*)</includeonly>", ""), (r"<graph([^<]*)</graph>", ""),
    (r"<section([^\\]*)/>", ""), (r"<meta([^\\]*)/>", ""), (r"<hr([^\\]*)/>", ""), (r"<gallery([^>]*)>", ""),
    (r"<ref([^<]*)</ref>", ""), (r"<ref([^>]*)>", ""), (r"<http([^>]*)>", ""), (r"<Ref([^>]*)>", ""),
    (r"<mapframe ([^/]*)/>", ""), (r"<mapframe([^>]*)>", ""), (r"</mapframe>", ""),
] + [(re.escape(t), "") for t in ("<poem>", "</poem>", "<math>", "</math>", "<ref>", "</ref>")] + [
    (r"<div([^>]*)>", ""), (r"</div([^>]*)>", ""),
] + [(re.escape(t), "") for t in (
    "</div style>", "</div>", "<sup>", "</sup>", "<br>", "</br>", "<BR>", "</BR>", "<Br>", "</Br>", "<del>",
    "</del>", "<nowiki>", "</nowiki>", "<NOWIKI>", "</NOWIKI>", "<onlyinclude>", "</onlyinclude>",
    "<includeonly>", "</includeonly>", "<small>", "</small>", "<chem>", "</chem>", "<noinclude>",
    "</noinclude>", "<gallery>", "</gallery>", "<graph>{", "<graph>", "}</graph>", "</graph>",
    "</references>")] + [(r"<poem ([^>]*)>", "")]
_SED = [(re.compile(pattern), repl) for pattern, repl in _SED]


def cleanup_file(text):
    """cleanup_file.py on the text of one WikiExtractor file."""
    out, skip = [], False
    for line in lines(text):
        if skip:
            skip = False
        elif "<doc" in line:
            out.append("\n")
            skip = True
        elif "</doc>" not in line and len(line) != 1:
            out.append(line)
    return "".join(out)


def clean_sh(text):
    """clean.sh on the output of cleanup_file."""
    out = []
    for line in text.split("\n"):  # sed's lines: only \n ends one
        if any(rx.search(line) for rx in _DROP):
            continue
        for rx, repl in _SED:
            line = rx.sub(repl, line)
        out.append(line)
    return "\n".join(out)


def clean(text):
    """The reference's cleaned text (its ``.2`` file) of one WikiExtractor file's text."""
    return clean_sh(cleanup_file(text))

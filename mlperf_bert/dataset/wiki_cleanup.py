"""WikiExtractor output -> cleaned text (REFERENCE.md section 6, step 2).

Each ``<doc ...>`` line and the title line after it become blank lines (the article
separator), ``</doc>`` lines and empty lines are dropped, and wiki markup that
WikiExtractor leaves behind is stripped (links keep their text, ``[x]`` -> x, tags go).
A line that the stripping empties stays as a blank line, as in the reference's shards.
"""
import re

_DROP_LINKS = re.compile(r"\[\[(?:Category|File|Image|Media):[^\[\]]*(?:\[\[[^\[\]]*\]\][^\[\]]*)*\]\]", re.I)
_PIPED_LINK = re.compile(r"\[\[[^\[\]|]*\|([^\[\]]*)\]\]")
_PLAIN_LINK = re.compile(r"\[\[([^\[\]|]*)\]\]")
_BRACKETS = re.compile(r"\[([^\[\]]*)\]")
_TAGS = ("ref|references|div|span|math|poem|small|big|sup|sub|nowiki|gallery|graph|chem|ce|br|hr|"
         "center|blockquote|code|score|timeline|imagemap|mapframe|syntaxhighlight|source|templatestyles|"
         "includeonly|noinclude|onlyinclude|abbr|u|s|font|p")
_TAG = re.compile(r"</?(?:%s)(?:\s[^<>]*)?/?>" % _TAGS, re.I)


def strip_markup(line):
    """``line`` without the wiki markup WikiExtractor leaves (links keep their text, tags go)."""
    line = _DROP_LINKS.sub("", line)
    line = _PIPED_LINK.sub(r"\1", line)
    line = _PLAIN_LINK.sub(r"\1", line)
    line = _BRACKETS.sub(r"\1", line)
    line = _TAG.sub("", line)
    return line.strip()


def clean_lines(lines):
    """Yield cleaned lines (without newlines) from the lines of one WikiExtractor file."""
    skip_title = False
    for line in lines:
        line = line.rstrip("\n")
        if skip_title:
            skip_title = False
            continue
        if line.startswith("<doc ") or line == "<doc>":
            # The doc line and the title each leave a blank line, as the reference's shards show.
            yield ""
            yield ""
            skip_title = True
            continue
        if line == "</doc>" or line == "":
            continue
        yield strip_markup(line)

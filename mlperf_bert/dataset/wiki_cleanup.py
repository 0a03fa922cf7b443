"""WikiExtractor output -> cleaned text, as the reference's clean-up steps make it (process_wiki.sh).

Two reference steps, transcribed rule for rule:

- ``cleanup_file.py`` reads the file with Python's universal newlines (``\\r`` and ``\\r\\n`` end
  lines too); a line holding ``<doc`` anywhere becomes ONE blank line and the line after it
  (the title) is dropped whatever it holds; lines holding ``</doc>`` and one-character lines
  (a bare newline) are dropped; every other line is kept as it is.
- ``clean.sh``: a line holding a ``[[Category:...]]`` link is dropped, then a chain of ``sed``
  substitutions (``_SED``, in the script's order, each applied to every match of the line)
  strips links and tags.  ``</doc>`` becomes a carriage return, which the next step's
  universal newlines read as a line end.  ``grep`` ends every line with a newline.

Its ``grep -v '^<doc [^>]*>$'`` is not transcribed: no line holding ``<doc`` survives the
first step.  POSIX bracket expressions do not treat ``\\`` as an escape, so sed's ``[^\\]`` is
"anything but a backslash" and ``[^\\/]`` "anything but a backslash or a slash".
"""
import re

_CATEGORY = re.compile(r"\[\[Category:[^\]\[]*\]\]")

# (pattern, replacement) of clean.sh's sed commands, in order.
_SED = [(re.compile(p), r) for p, r in [
    (r"\[\[([^\]|\[]*)\]\]", r"\1"),
    (r"\[\[([^\]|\[]*)\]\]", r"\1"),
    (r"\[\[[^\]|\[]*\|([^\]|\[]*)\]\]", r"\1"),
    (r"\[\[[^\]|\[]*\|([^\]|\[]*)\]\]", r"\1"),
    (r"\[\[:*[Ff]ile:[^\]\[]*\]\]", ""),
    (r"\[\[[Mm]edia:[^\]\[]*\]\]", ""),
    (r"\[\[[Ii]mage:[^\]\[]*\]\]", ""),
    (r"\[([^\]|\[]*)\]", r"\1"),
    (r"\[\[[^\]\[]*\]\]", ""),
    (r"alt=", ""),
    (r"</doc>", "\r"),
    (r"<chem([^<]*)</chem>", r"\1"),
    (r"<ins([^<]*)</ins>", r"\1"),
    (r"<, ref [^<]*</ref>", ""),
    (r"<includeonly[^<]*</includeonly>", ""),
    (r"<graph[^<]*</graph>", ""),
    (r"<section[^\\]*/>", ""),
    (r"<meta[^\\]*/>", ""),
    (r"<hr[^\\]*/>", ""),
    (r"<gallery[^>]*>", ""),
    (r"<ref[^<]*</ref>", ""),
    (r"<ref[^>]*>", ""),
    (r"<http[^>]*>", ""),
    (r"<Ref[^>]*>", ""),
    (r"<mapframe [^\\/]*/>", ""),
    (r"<mapframe[^>]*>", ""),
    (r"</mapframe>", ""),
    (r"<poem>", ""),
    (r"</poem>", ""),
    (r"<math>", ""),
    (r"</math>", ""),
    (r"<ref>", ""),
    (r"</ref>", ""),
    (r"<div[^>]*>", ""),
    (r"</div[^>]*>", ""),
    (r"</div style>", ""),
    (r"</div>", ""),
] + [(re.escape(tag), "") for tag in [
    "<sup>", "</sup>", "<br>", "</br>", "<BR>", "</BR>", "<Br>", "</Br>", "<del>", "</del>",
    "<nowiki>", "</nowiki>", "<NOWIKI>", "</NOWIKI>", "<onlyinclude>", "</onlyinclude>",
    "<includeonly>", "</includeonly>", "<small>", "</small>", "<chem>", "</chem>",
    "<noinclude>", "</noinclude>", "<gallery>", "</gallery>", "<graph>{", "<graph>", "}</graph>",
    "</graph>", "</references>"]] + [
    (r"<poem [^>]*>", ""),
]]


def universal_lines(text):
    """The lines of ``text`` as Python's universal-newlines reading gives them (each ending in \\n but the last)."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    # not str.splitlines: it also splits at \v, \f, \x1c-\x1e, \x85, \u2028 and \u2029
    lines = text.split("\n")
    last = lines.pop()
    out = [line + "\n" for line in lines]
    if last:
        out.append(last)
    return out


def cleanup_file_lines(text):
    """``cleanup_file.py``: the kept lines of one WikiExtractor file's text."""
    keep_next = True
    for line in universal_lines(text):
        if not keep_next:
            keep_next = True
            continue
        if "<doc" in line:
            keep_next = False
            yield "\n"
        elif "</doc>" in line or len(line) == 1:
            continue
        else:
            yield line


def clean_line(line):
    """``clean.sh`` on one line (without its newline): the cleaned line, or None when dropped."""
    if "[" not in line and "<" not in line and "alt=" not in line:
        return line  # no command can match
    if _CATEGORY.search(line):
        return None
    for pattern, replacement in _SED:
        line = pattern.sub(replacement, line)
    return line


def clean_text(text):
    """Both clean-up steps on one WikiExtractor file's text: the reference's ``.2`` file."""
    out = []
    for line in cleanup_file_lines(text):
        line = clean_line(line[:-1] if line.endswith("\n") else line)
        if line is not None:
            out.append(line + "\n")
    return "".join(out)

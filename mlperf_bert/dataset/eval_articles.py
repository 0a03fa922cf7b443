"""``eval.txt`` and ``eval.md5``: the md5 of each eval article, as the reference's
``seperate_test_set.py`` lists them (text-pipeline writes them, verify checks them)."""
import hashlib

from mlperf_bert.fileio import open_input


def article_md5(article):
    """An eval article's ``eval.md5`` line: md5 of the rstripped text, UTF-8 (the reference's seperate_test_set.py)."""
    return hashlib.md5(article.rstrip().encode("utf-8")).hexdigest()


def article_md5s(text, want=()):
    """md5 of each article of an ``eval.txt`` text, as ``eval.md5`` lists them.

    The reference writes each article and a blank line. An article holds no blank line but may
    start with a newline, or be one (a file's last piece), so a run of newlines can be cut more
    than one way (five: ``X``, ``"\n"``, ``Y`` or ``X``, ``""``, ``"\nY"``): the cut whose md5s
    are ``want``'s (eval.md5's) is taken; from an article no cut fits on, the leftmost cuts.
    """
    frontier, layers = {0: None}, []  # position after i articles -> (position before, md5)
    for w in want:
        nxt = {}
        for p in frontier:
            q = text.find("\n\n", p)
            cuts = [] if q < 0 else [(text[p:q], q + 2)] + ([("\n", p + 3)] if text.startswith("\n\n\n", p) else [])
            for article, end in cuts:
                md5 = article_md5(article)
                if md5 == w and end not in nxt:
                    nxt[end] = (p, md5)
        if not nxt:
            break
        layers.append(nxt)
        frontier = nxt
    end = pos = len(text) if len(text) in frontier else min(frontier)
    got = []
    for layer in reversed(layers):
        pos, md5 = layer[pos]
        got.append(md5)
    got.reverse()
    return got + [article_md5(a) for a in text[end:].split("\n\n")[:-1]]


def check_eval_articles(eval_txt, eval_md5):
    """One result line comparing eval.txt article by article with eval.md5."""
    texts = {}
    for path in (eval_txt, eval_md5):
        with open_input(path, "rb") as f:
            data = f.read()
        try:
            texts[path] = data.decode("utf-8")  # as read, "\r\n" kept: an article's md5 is of its bytes
        except UnicodeDecodeError as e:  # the reference writes both as UTF-8: damaged
            return False, "MISMATCH %s is not UTF-8 text (byte %d): damaged, regenerate it" % (path, e.start)
    want = texts[eval_md5].split()
    got = article_md5s(texts[eval_txt], want)
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return False, "MISMATCH %s article %d: md5 %s, eval.md5 line %d says %s" % (
                eval_txt, i, g, i + 1, w)
    if len(got) != len(want):
        return False, "MISMATCH %s has %d articles, %s lists %d" % (eval_txt, len(got), eval_md5, len(want))
    return True, "OK %s articles match %s (%d)" % (eval_txt, eval_md5, len(got))

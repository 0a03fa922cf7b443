"""The optional C accelerator ``_fastrng``, taken only when built from this checkout's sources."""
from mlperf_bert.errors import UserError

# _fastrng.c's VERSION, raised with each change of what its functions take or raise: an in-place
# build older than a `git pull` misread records (int64 values wrapped; its errors unpacked wrongly)
FASTRNG_VERSION = 2


def fastrng():
    """The ``_fastrng`` module, or None when it is not built; one built from other sources is refused."""
    try:
        from mlperf_bert.dataset import _fastrng
    except ImportError:
        return None
    if getattr(_fastrng, "VERSION", 1) != FASTRNG_VERSION:
        raise UserError("%s was built from other sources than this checkout's _fastrng.c (version %s, not %d): "
                        "rebuild it (make venv, or pip install -e .)"
                        % (_fastrng.__file__, getattr(_fastrng, "VERSION", 1), FASTRNG_VERSION))
    return _fastrng

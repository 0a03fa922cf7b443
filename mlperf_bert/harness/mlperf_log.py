"""MLPerf logging through ``mlperf_logging.mllog``: one logger per run, only rank 0 writes.

Each run gets its own ``logging.Logger`` with a file handler (not the package's global
logger), so several runs in one process (tests) never write into each other's files.
"""
import functools
import itertools
import logging

from mlperf_logging.mllog.mllog import MLLogger
from mlperf_logging.mllog import constants as C

from mlperf_bert.errors import UserError

_ids = itertools.count()


def eval_frequency(global_batch_size):
    """Training samples between evaluations (mlcommons/training retired_benchmarks/bert/README.md, "Stopping criteria")."""
    return int(0.05 * (230.23 * global_batch_size + 3000000) / 25000) * 25000


class MLPerfLog:
    """``event``/``start``/``end`` write ``:::MLLOG`` lines to ``path`` on rank 0; no-ops elsewhere."""

    def __init__(self, path, rank=0, echo=False):
        self.enabled = rank == 0 and (path is not None or echo)
        self._handlers = []
        self._mllogger = None
        if not self.enabled:
            return
        logger = logging.getLogger("mlperf_bert.mllog.%d" % next(_ids))
        logger.propagate = False
        logger.setLevel(logging.INFO)
        if path is not None:
            try:
                h = logging.FileHandler(path, mode="a", encoding="utf-8")
            except OSError as e:
                raise UserError("cannot write MLPerf log %s: %s (choose a writable --mlperf_log)"
                                % (path, e.strerror))
            self._handlers.append(h)
        if echo:
            import sys
            self._handlers.append(logging.StreamHandler(sys.stdout))
        for h in self._handlers:
            logger.addHandler(h)
        self._logger = logger
        self._mllogger = MLLogger(logger=logger, default_stack_offset=2)

    def event(self, key, value=None, metadata=None, depth=0):
        """``depth``: frames between the caller named in the metadata and this method."""
        if self._mllogger:
            self._mllogger.event(key=key, value=value, metadata=metadata, stack_offset=2 + depth)

    def start(self, key, value=None, metadata=None):
        if self._mllogger:
            self._mllogger.start(key=key, value=value, metadata=metadata)

    def end(self, key, value=None, metadata=None):
        if self._mllogger:
            self._mllogger.end(key=key, value=value, metadata=metadata)

    def close(self):
        for h in self._handlers:
            h.flush()
            h.close()
            self._logger.removeHandler(h)
        self._handlers = []
        self._mllogger = None

    def submission(self, division, org, platform, status="onprem"):
        event = functools.partial(self.event, depth=1)  # file/lineno of our caller, not of this file
        event(C.SUBMISSION_BENCHMARK, C.BERT)
        event(C.SUBMISSION_ORG, org)
        event(C.SUBMISSION_DIVISION, division)
        event(C.SUBMISSION_STATUS, status)
        event(C.SUBMISSION_PLATFORM, platform)

    def hyperparameters(self, global_batch_size, learning_rate, epsilon, train_steps, warmup_steps,
                        start_warmup_step, beta_1, beta_2, weight_decay_rate, accumulation_steps,
                        seed, max_sequence_length, target_accuracy):
        """Every hyperparameter key of the closed BERT rules, each exactly once."""
        event = functools.partial(self.event, depth=1)
        event(C.GLOBAL_BATCH_SIZE, global_batch_size)
        event(C.OPT_BASE_LR, learning_rate)
        event(C.OPT_LAMB_EPSILON, epsilon)
        event(C.OPT_LR_TRAINING_STEPS, train_steps)
        event(C.OPT_LR_WARMUP_STEPS, warmup_steps)
        event(C.NUM_WARMUP_STEPS, warmup_steps)
        event(C.START_WARMUP_STEP, start_warmup_step)
        event(C.OPT_LAMB_BETA_1, beta_1)
        event(C.OPT_LAMB_BETA_2, beta_2)
        event(C.OPT_LAMB_WEIGHT_DECAY, weight_decay_rate)
        event(C.GRADIENT_ACCUMULATION_STEPS, accumulation_steps)
        event(C.SEED, seed)
        event("max_sequence_length", max_sequence_length)
        # Not an official key: tells this project's log checker which target the run used.
        event("target_accuracy", target_accuracy)

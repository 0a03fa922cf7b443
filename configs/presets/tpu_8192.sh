# shellcheck shell=bash
# The reference TPU hyperparameters at global batch 8192 (mlcommons/training
# retired_benchmarks/bert/README.md, "On TPU-v3-128"), as 16 micro-steps of 512 sequences:
# 64 per GPU on 8 GPUs, within MAX_PER_GPU_BATCH (the memory plan, trainer/memory_plan.py; 128,
# the next power of two, is above it). The step counts are the reference's (600 updates, warmup
# 287 from -76) times 16: the trainer's step counter counts micro-steps; the MLPerf log states
# them in updates again.
PRESET_NUM_GPUS=8
PRESET_BERT_CONFIG=configs/bert_config_large.json
PRESET_FLAGS=(
  --max_seq_length=512
  --max_predictions_per_seq=76
  --train_batch_size=512
  --steps_per_update=16
  --learning_rate=0.00288293
  --optimizer=lamb
  --dtype=bf16
  --lamb_beta_1=0.88
  --lamb_beta_2=0.88
  --lamb_weight_decay_rate=0.0166629
  --log_epsilon=-6
  --num_train_steps=9600
  --num_warmup_steps=4592
  --start_warmup_step=-1216
  --eval_batch_size=640
  --max_eval_steps=125
  --target_mlm_accuracy=0.720
  --submission_division=closed
)

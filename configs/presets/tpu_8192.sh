# shellcheck shell=bash
# The reference TPU hyperparameters at global batch 8192 (mlcommons/training
# retired_benchmarks/bert/README.md, "On TPU-v3-128"), as 8 micro-steps of 1,024 sequences:
# 128 per GPU on 8 GPUs, within MAX_PER_GPU_BATCH (the memory plan, trainer/memory_plan.py).
# The step counts are the reference's (600 updates, warmup 287 from -76) times 8: the trainer's
# step counter counts micro-steps; the MLPerf log states them in updates again.
PRESET_NUM_GPUS=8
PRESET_BERT_CONFIG=configs/bert_config_large.json
PRESET_FLAGS=(
  --max_seq_length=512
  --max_predictions_per_seq=76
  --train_batch_size=1024
  --steps_per_update=8
  --learning_rate=0.00288293
  --optimizer=lamb
  --dtype=bf16
  --lamb_beta_1=0.88
  --lamb_beta_2=0.88
  --lamb_weight_decay_rate=0.0166629
  --log_epsilon=-6
  --num_train_steps=4800
  --num_warmup_steps=2296
  --start_warmup_step=-608
  --eval_batch_size=640
  --max_eval_steps=125
  --target_mlm_accuracy=0.720
  --submission_division=closed
)

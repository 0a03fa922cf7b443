# shellcheck shell=bash
# The reference TPU hyperparameters at global batch 8192 (mlcommons/training
# retired_benchmarks/bert/README.md, "On TPU-v3-128").
# On GPUs keep the global batch: e.g. --train_batch_size=1024 --steps_per_update=8, and scale
# the step counts by 8 (the reference's step counter counts micro-steps).
PRESET_NUM_GPUS=8
PRESET_BERT_CONFIG=configs/bert_config_large.json
PRESET_FLAGS=(
  --max_seq_length=512
  --max_predictions_per_seq=76
  --train_batch_size=8192
  --learning_rate=0.00288293
  --optimizer=lamb
  --dtype=bf16
  --lamb_beta_1=0.88
  --lamb_beta_2=0.88
  --lamb_weight_decay_rate=0.0166629
  --log_epsilon=-6
  --num_train_steps=600
  --num_warmup_steps=287
  --start_warmup_step=-76
  --steps_per_update=1
  --eval_batch_size=640
  --max_eval_steps=125
  --target_mlm_accuracy=0.720
  --submission_division=closed
)

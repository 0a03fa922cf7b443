# shellcheck shell=bash
# rcp_<global batch>: a reference convergence point of mlperf_logging's rcps_bert.json (training
# 5.0.0). train_model.sh fills PRESET_FLAGS from that file for NUM_GPUS x NNODES GPUs
# (python -m mlperf_bert.harness.rcp); the hyperparameters are never copied here by hand.
PRESET_NUM_GPUS=8
PRESET_BERT_CONFIG=configs/bert_config_large.json
PRESET_FLAGS=()

"""The dataset pipeline: Wikipedia text -> text shards -> reference-exact TFRecords, checksums."""

"""MLPerf BERT pre-training: reference-exact dataset generation, trainer and compliance tools."""

__version__ = "0.1.0"

"""sftprof: profiled LLM fine-tuning, from Nsight Systems capture to an answered report."""

__version__ = "0.1.0"

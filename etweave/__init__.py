"""etweave: lossless conversion of PyTorch host execution traces and Kineto traces to Chakra .et files."""

__version__ = "0.1.0"

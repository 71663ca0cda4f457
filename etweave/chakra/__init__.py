"""Chakra execution-trace format: the protobuf schema and the varint-delimited stream."""

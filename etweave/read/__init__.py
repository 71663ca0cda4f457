"""Stage read: host execution traces and Kineto traces into plain typed records."""
